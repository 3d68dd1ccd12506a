"""Where a command may write: a missing or empty directory, or, on request, its own earlier output.

Every command that writes a folder (``hf-dpmerge merge``/``tune``, ``similarity``, ``push --dry-run``'s staging)
refuses a path that is a file, and replaces a non-empty directory only when overwriting was asked for *and* the
directory holds the command's marker file (what it wrote there before); anything else is never deleted. The
writers then stage their output beside the target and rename it into place (:func:`.io.staged_directory`), so
an interrupted command leaves nothing half-written.
"""

from __future__ import annotations

import os
from pathlib import Path


def check_own_output(target: str | os.PathLike, *, overwrite: bool, marker: str, output: str, flag: str) -> None:
    """Refuse ``target`` unless it is missing, an empty directory, or (``overwrite``) a directory holding ``marker``.

    ``output`` names what the command writes (``"merge"``), ``flag`` the option that chose the path; both go into
    the error so that it says what to change.
    """
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"{flag} {target} exists and is not a directory: choose another {flag}")
    if not target.is_dir() or not any(target.iterdir()):
        return
    if not overwrite:
        raise FileExistsError(f"{flag} {target} exists and is not empty; pass --overwrite to replace a previous "
                              f"{output}, or choose another {flag}")
    if not (target / marker).is_file():
        raise FileExistsError(f"{flag} {target} is not empty and holds no previous {output} (no {marker}); refusing "
                              f"to replace it even when overwriting: remove it yourself or choose another {flag}")
