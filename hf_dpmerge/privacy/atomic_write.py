"""Write a text file so that readers see the old content or the whole new content, never a partial file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text_atomic(target: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to a temporary file beside ``target``, then rename it over ``target``."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
