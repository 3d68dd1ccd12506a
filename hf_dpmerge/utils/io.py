"""Where files go: atomic output (readers see the old content or the whole new content, never a partial file or
directory), and whether a model location can exist.

- :func:`write_text_atomic` / :func:`write_bytes_atomic`: a file written beside its target, then renamed over it;
- :func:`require_model_source`: a model location that can exist (a directory, or a Hub id while online);
- :func:`apply_open_modes`: every file of a release gets the mode a plain ``open`` gives (0666 less the umask);
- :func:`staged_directory`: a directory built beside its target, then renamed into place. A process killed
  mid-write leaves only a hidden ``.<name>.incomplete-*`` scratch directory beside the target, never a
  complete-looking ``<name>``.
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

    If the block succeeds and created it, it replaces ``target`` with the modes of a plain write (an existing
    ``target`` is moved aside first and restored if the final rename fails). The scratch dir is removed either
    way, so a failure leaves ``target`` untouched and nothing else behind. An ``OSError`` that names no file
    (a full disk: ``ENOSPC`` from a write) is re-raised naming ``target``.
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
            apply_open_modes(staged)
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


def _umask() -> int:
    """The process's umask (read by setting it, then restoring it)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_open_modes(root: str | os.PathLike) -> None:
    """Give every file under ``root`` the mode ``open`` would (0666 less the umask) and every folder 0777 less
    the umask: some writers (safetensors, mkstemp) leave 0600, which other readers of a release cannot open. The
    one rule for release files: :func:`staged_directory` applies it, and so does every writer that adds files to a
    release in place."""
    root = Path(root)
    mask = _umask()
    paths = [root, *root.rglob("*")] if root.is_dir() else [root]
    for path in paths:
        if not path.is_symlink():
            path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def write_bytes_atomic(target: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to a temporary file beside ``target``, then rename it over ``target``; the file gets the
    mode a plain ``open`` would give it (0666 less the umask)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 is for scratch files; a release is read by others
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def write_text_atomic(target: str | os.PathLike, text: str) -> Path:
    """:func:`write_bytes_atomic` of ``text`` encoded as UTF-8."""
    return write_bytes_atomic(target, text.encode())


def is_hub_repo_id(text: str) -> bool:
    """Whether ``text`` is a well-formed Hub repo id (``name`` or ``namespace/name``), by huggingface_hub's own rule
    (:func:`huggingface_hub.utils.validate_repo_id`)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def require_model_source(source: str | os.PathLike, what: str = "model") -> None:
    """Refuse a location that is no directory and cannot be a Hub id, or, offline, a Hub id whose
    ``config.json`` is not in the huggingface_hub cache (transformers loads a cached one with
    ``local_files_only``).

    transformers and mergekit report a missing local path as a malformed Hub repo id; this names the path.
    """
    from huggingface_hub import constants, try_to_load_from_cache

    source = str(source)
    if os.path.isdir(source):
        return
    if not is_hub_repo_id(source):
        raise FileNotFoundError(f"{what} directory {source} does not exist")
    if constants.HF_HUB_OFFLINE and not isinstance(try_to_load_from_cache(source, "config.json"), str):
        raise FileNotFoundError(
            f"{what} directory {source} does not exist, and the Hub id {source} is not in the Hugging Face "
            "cache (offline mode is on: download it once online, or pass a local directory)"
        )
