"""Every merge method tuned alike: the same budget of points (:mod:`.merge_space`), selected on validation only.

For one method and cell: merge at each point, score the merge on the validation subsets (mean accuracy over
tasks), keep the best (the first on ties), then score that one merge on the test subsets: the test split is
read once, after the choice, for the chosen point only. The merges not chosen are discarded as soon as they
lose.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .scoring import Correct, accuracy

VALIDATION, TEST = "validation", "test"


def tune(points: list[dict[str, Any]], merge: Callable[[int, dict[str, Any]], Path],
         score: Callable[[Path, str], Correct], discard: Callable[[Path], None]) -> dict[str, Any]:
    """Pick the point whose merge scores best on validation; score only that merge on test.

    ``merge(i, point)`` writes the merge and returns its directory; ``score(directory, split)`` returns per-task
    0/1 vectors; ``discard(directory)`` removes a merge. Returns ``trials`` (point, per-task validation accuracy,
    their mean), ``selected`` (index), ``point`` and ``test`` (the chosen merge's per-task 0/1 vectors).
    """
    if not points:
        raise ValueError("no points to tune over")
    trials, best, best_dir = [], None, None
    for index, point in enumerate(points):
        directory = merge(index, point)
        validation = accuracy(score(directory, VALIDATION))
        mean = float(np.mean(list(validation.values())))
        trials.append({"point": point, "validation": validation, "mean": mean})
        if best is None or mean > trials[best]["mean"]:
            if best_dir is not None:
                discard(best_dir)
            best, best_dir = index, directory
        else:
            discard(directory)
    test = score(best_dir, TEST)
    discard(best_dir)
    return {"trials": trials, "selected": best, "point": points[best], "test": test}
