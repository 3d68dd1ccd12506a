"""Atomic directory output: build a directory beside its target, then rename it into place.

A process killed mid-write leaves only a hidden ``.<name>.incomplete-*`` scratch directory beside the
target, never a complete-looking ``<name>``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def staged_directory(target: str | Path) -> Iterator[Path]:
    """Yield an empty directory path (same basename as ``target``, in a hidden scratch dir beside it).

    If the block succeeds and created it, it replaces ``target`` (an existing ``target`` is moved aside
    first and restored if the final rename fails). The scratch dir is removed either way, so a failure
    leaves ``target`` untouched and nothing else behind. An ``OSError`` that names no file (a full disk:
    ``ENOSPC`` from a write) is re-raised naming ``target``.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.incomplete-", dir=target.parent))
    staged = scratch / target.name
    try:
        try:
            yield staged
        except OSError as err:
            if err.filename is not None or err.errno is None:
                raise
            raise type(err)(err.errno, f"{err.strerror or os.strerror(err.errno)} while writing {target}") from err
        if staged.exists():
            previous = scratch / f"{target.name}.previous"
            if target.exists():
                target.rename(previous)
            try:
                staged.rename(target)
            except OSError:
                if previous.exists():
                    previous.rename(target)
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
