"""Where ``hf-dpmerge merge`` may write: an existing non-empty output directory is replaced only on request.

The policy is hf-dpmerge merge's (plain ``mergekit-yaml`` keeps mergekit's own behaviour). The merge writes
into a scratch directory beside its output and renames it into place at the end
(:func:`~hf_dpmerge.utils.io.staged_directory`), so an interrupted merge leaves nothing at the output
path. The output path itself may be missing or an empty directory. A non-empty directory is replaced only
when overwriting was asked for (``--overwrite``) *and* it holds a previous merge (mergekit's
``mergekit_config.yml``); anything else there is never deleted.
"""

from __future__ import annotations

import os
from pathlib import Path

MERGE_MARKER = "mergekit_config.yml"


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
