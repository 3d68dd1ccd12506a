"""Where ``hf-dpmerge merge`` may write: an existing non-empty output directory is replaced only on request.

The policy is hf-dpmerge merge's (plain ``mergekit-yaml`` keeps mergekit's own behaviour). The merge writes
into a scratch directory beside its output and renames it into place at the end
(:func:`~hf_dpmerge.utils.io.staged_directory`), so an interrupted merge leaves nothing at the output
path. The output path itself may be missing or an empty directory. A non-empty directory is replaced only
when overwriting was asked for (``--overwrite``, passed to the guarded ``run_merge`` as
``HF_DPMERGE_OVERWRITE=1`` because mergekit's command line cannot carry it) *and* it holds a previous merge
(mergekit's ``mergekit_config.yml``); anything else there is never deleted.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

OVERWRITE_ENV = "HF_DPMERGE_OVERWRITE"
MERGE_MARKER = "mergekit_config.yml"


def overwrite_requested() -> bool:
    """Whether ``HF_DPMERGE_OVERWRITE=1`` is set."""
    return os.environ.get(OVERWRITE_ENV) == "1"


@contextmanager
def overwrite_allowed(allowed: bool) -> Iterator[None]:
    """Set ``HF_DPMERGE_OVERWRITE=1`` for the block when ``allowed`` (restored afterwards)."""
    previous = os.environ.get(OVERWRITE_ENV)
    if allowed:
        os.environ[OVERWRITE_ENV] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(OVERWRITE_ENV, None)
        else:
            os.environ[OVERWRITE_ENV] = previous


def check_merge_output(target: str | os.PathLike, overwrite: bool) -> None:
    """Refuse an output path that is a file, or a non-empty directory unless ``overwrite`` and a previous merge."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"merge output {target} exists and is not a directory")
    if not target.is_dir() or not any(target.iterdir()):
        return
    if not overwrite:
        raise FileExistsError(
            f"merge output {target} exists and is not empty; pass --overwrite to replace a previous merge"
        )
    if not (target / MERGE_MARKER).is_file():
        raise FileExistsError(
            f"merge output {target} is not empty and holds no previous merge (no {MERGE_MARKER}); refusing to "
            "replace it even when overwriting: remove it yourself or choose another output path"
        )
