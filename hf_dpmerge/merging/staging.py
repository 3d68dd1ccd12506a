"""Atomic directory output: build a directory beside its target, then rename it into place."""

from __future__ import annotations

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
    leaves ``target`` untouched and nothing else behind.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    staged = scratch / target.name
    try:
        yield staged
        if staged.exists():
            previous = scratch / "previous"
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
