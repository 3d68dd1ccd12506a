"""The base a merged model was merged from, and whether the adapters released or scored with it trained on that base.

``hf-dpmerge push`` and ``hf-dpmerge evaluate`` read a merged model beside the runs it merged; the merge's base is the
``base_model`` its ``mergekit_config.yml`` names, where that is a local directory, else the runs' base. Each run's
privacy record fingerprints the base weights its adapter modifies (:mod:`.fingerprint`), so a run trained on another
base is refused by name instead of being released or scored as part of the merge.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from hf_dpmerge.records.fingerprint import directory_fingerprint
from hf_dpmerge.records.record import PrivacyRecord
from hf_dpmerge.records.run_folders import MERGE_CONFIG_NAME


def merged_config(merged_dir: str | os.PathLike) -> Any:
    """The parsed ``mergekit_config.yml`` of a merge output (None when it has none)."""
    config = Path(merged_dir) / MERGE_CONFIG_NAME
    return yaml.safe_load(config.read_text(encoding="utf-8")) if config.is_file() else None


def merge_base_dir(merged_dir: str | os.PathLike, default: str | os.PathLike | None,
                   roots: Sequence[str | os.PathLike] = ()) -> Path | None:
    """The base directory ``merged_dir`` was merged from: the ``base_model`` of its ``mergekit_config.yml`` when that
    is a local directory (as written, else under one of ``roots``: where a relative path was written from), else
    ``default`` when it is a directory; None when neither is."""
    data = merged_config(merged_dir)
    named = data.get("base_model") if isinstance(data, dict) else None
    if isinstance(named, str):
        for candidate in (Path(named), *(Path(root) / named for root in roots)):
            if candidate.is_dir():
                return candidate
    return Path(default) if default is not None and Path(default).is_dir() else None


def check_trained_on(records: Mapping[str, PrivacyRecord], base_dir: str | os.PathLike, fix: str,
                     role: str = "the merge's base") -> bool:
    """Refuse (``ValueError``, one line naming the task, ``base_dir`` as ``role`` and ``fix``) a task whose record's
    base fingerprint is not ``base_dir``'s; True when every record has a fingerprint, so that all were checked."""
    checked = True
    for task, record in records.items():
        if not record.base_model_hash or not record.base_model_hash_tensors:
            checked = False
            continue
        actual = directory_fingerprint(base_dir, record.base_model_hash_tensors)
        if actual != record.base_model_hash:
            raise ValueError(f"task {task!r} was trained on another base model: its privacy record's base_model_hash "
                             f"{record.base_model_hash} does not match {role} {base_dir} {actual}; {fix}")
    return checked
