"""Releasing an adapter: its weights and its ``dp_privacy.json`` appear together, or no record appears.

A release holds only the files of ``RELEASE_ALLOW_LIST`` (:mod:`hf_dpmerge.records.release_files`: weights,
adapter/model configuration, tokenizer files, the privacy record and the card); anything else the writer
produced (Trainer's ``training_args.bin``, which holds ``dp_seed``) is dropped before the release appears.

The release is written into a scratch directory beside the target first
(:func:`~hf_dpmerge.utils.io.staged_directory`). A missing or empty target is then replaced by a
single rename. A non-empty target (e.g. a run's ``output_dir``, which holds its checkpoints) receives the
files one atomic rename each: its old ``dp_privacy.json`` is removed first and the new one is moved in last,
so a process killed half-way leaves a directory without a record, which merging, evaluation and push refuse.
A target that already holds a release is replaced only on request, and weights holding NaN or inf are never
released.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from hf_dpmerge.records.record import PRIVACY_RECORD_NAME
from hf_dpmerge.records.release_files import unlisted_files
from hf_dpmerge.utils.adapter_files import ADAPTER_CONFIG_NAME, ADAPTER_SAFETENSORS_NAME
from hf_dpmerge.utils.io import staged_directory

RELEASE_FILES = (PRIVACY_RECORD_NAME, ADAPTER_CONFIG_NAME, ADAPTER_SAFETENSORS_NAME)


def keep_release_files(directory: str | os.PathLike) -> list[str]:
    """Delete from ``directory`` every file the allow-list does not name (and emptied folders); returns them."""
    root = Path(directory)
    removed = unlisted_files(root)
    for rel in removed:
        (root / rel).unlink()
    for folder in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()
    return removed


def check_finite_weights(names: Sequence[str], params: Sequence[torch.Tensor]) -> None:
    """Refuse to release weights holding NaN or inf, naming the first such parameter."""
    for name, param in zip(names, params):
        if not bool(torch.isfinite(param).all()):
            raise FloatingPointError(f"{name} holds NaN or infinite values: the adapter is not released")


def _move_into(staged: Path, target: Path) -> None:
    """Move the staged release into a non-empty ``target``: old record out first, new record in last."""
    (target / PRIVACY_RECORD_NAME).unlink(missing_ok=True)
    for item in sorted(staged.iterdir()):
        if item.name == PRIVACY_RECORD_NAME:
            continue
        destination = target / item.name
        if item.is_dir() and destination.is_dir():
            shutil.rmtree(destination)
        os.replace(item, destination)
    os.replace(staged / PRIVACY_RECORD_NAME, target / PRIVACY_RECORD_NAME)
    staged.rmdir()


def check_release_target(target: str | os.PathLike, overwrite: bool = False) -> None:
    """Refuse a file, or a directory holding a release unless ``overwrite`` (scripts call it before training)."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"adapter output {target} exists and is not a directory")
    previous = [name for name in RELEASE_FILES if (target / name).exists()]
    if previous and not overwrite:
        raise FileExistsError(
            f"{target} already holds a released adapter ({', '.join(previous)}); pass overwrite=True to replace it"
        )


def release_adapter(target: str | os.PathLike, write: Callable[[Path], None], overwrite: bool = False) -> Path:
    """Run ``write(directory)`` (adapter files and ``dp_privacy.json``) and put the result at ``target``."""
    target = Path(target)
    check_release_target(target, overwrite)
    with staged_directory(target) as staged:
        staged.mkdir()
        write(staged)
        keep_release_files(staged)
        if target.is_dir() and any(target.iterdir()):
            _move_into(staged, target)
    return target
