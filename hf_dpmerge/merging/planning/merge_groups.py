"""Merge groups: adapters whose task vectors point the same way, found by hierarchical clustering.

Average-linkage agglomerative clustering (scipy) on the distance 1 − c(τᵢ, τⱼ), c the lower end of the
noise-aware cosine's interval of :mod:`.task_similarity` (sampling and the noise model's ±20 %;
the plain cosine for non-private adapters), cut at 1 − ``threshold``: two clusters join while the mean of c
between their members is at least ``threshold``, so a pair whose interval straddles the threshold stays apart.
Each group of two or more adapters gets one mergekit config; an adapter alone in its group needs no merge (use it
as it is).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hf_dpmerge.merging.merge_config import lora_merge_config, merge_config_yaml
from hf_dpmerge.merging.planning.task_similarity import SimilarityReport

DEFAULT_THRESHOLD = 0.1
"""Default cosine similarity at which adapters group (see docs/merging.md, "Task grouping")."""


def merge_groups(report: SimilarityReport, threshold: float = DEFAULT_THRESHOLD) -> list[list[str]]:
    """Groups of run names, each group in input order, groups ordered by their first member."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    if not -1.0 <= threshold <= 1.0:
        raise ValueError(f"--threshold is a cosine similarity in [-1, 1], got {threshold}")
    distance = np.clip(1.0 - report.grouping_cosine, 0.0, 2.0)  # the interval's lower end (task_similarity)
    np.fill_diagonal(distance, 0.0)
    tree = linkage(squareform((distance + distance.T) / 2, checks=False), method="average")
    labels = fcluster(tree, t=1.0 - threshold, criterion="distance")
    groups: dict[int, list[str]] = {}
    for name, label in zip(report.names, labels, strict=True):
        groups.setdefault(int(label), []).append(name)
    return list(groups.values())


def write_group_configs(
    report: SimilarityReport,
    groups: Sequence[Sequence[str]],
    base: str | os.PathLike,
    method: str,
    directory: str | os.PathLike,
    final_directory: str | os.PathLike | None = None,
) -> list[Path]:
    """``merge_group_<k>.yaml`` in ``directory`` for every group of ≥ 2 adapters, merging them with ``method``;
    each config's ``Run:`` line names it in ``final_directory`` (where a staged ``directory`` ends up)."""
    directory = Path(directory)
    shown = Path(final_directory) if final_directory is not None else directory
    paths = []
    multi = [group for group in groups if len(group) > 1]
    for number, group in enumerate(multi, start=1):
        adapters = [report.adapter_dirs[report.names.index(name)] for name in group]
        config = lora_merge_config(method, base, adapters)
        pairs = [(a, b) for k, a in enumerate(group) for b in group[k + 1:]]
        cosines = ", ".join(
            f"{a}/{b} {report.cosine[report.names.index(a), report.names.index(b)]:.3f} (noise-aware "
            f"{report.denoised_cosine[report.names.index(a), report.names.index(b)]:.3f})" for a, b in pairs
        )
        comment = (f"Merge group {number} from hf-dpmerge similarity: {', '.join(group)}\n"
                   f"cosine similarity of the task vectors: {cosines}\n"
                   f"Run: mergekit-yaml {shown / f'merge_group_{number}.yaml'} merged/group_{number} "
                   f"--lora-merge-cache lora_cache")
        path = directory / f"merge_group_{number}.yaml"
        path.write_text(merge_config_yaml(config, comment))
        paths.append(path)
    return paths
