"""Where a user's own task reads its rows and which columns hold what: :class:`DatasetSource`.

Training writes it to ``<runs>/<task>/dataset.json`` (beside the release, never inside it), so ``evaluate``, ``tune``,
``similarity`` and ``diagnose`` read the same rows and splits. Loading and checking: :mod:`hf_dpmerge.data.own_data`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from hf_dpmerge.utils.io import write_text_atomic

DATASET_SOURCE_NAME = "dataset.json"
SPLIT_FILES = ("train_file", "validation_file", "test_file")
LABELS_FROM_USER = "--label_names"
LABELS_FROM_SCHEMA = "the dataset's ClassLabel schema"
LABELS_FROM_PRIVATE_DATA = "the private training rows (outside ε)"


@dataclass(frozen=True)
class DatasetSource:
    """A dataset given as files (``train_file``… : csv, json, jsonl, parquet) or by ``dataset_name`` (a local
    ``save_to_disk`` folder or a Hub id, with ``dataset_config_name``). ``text_column`` (and ``text_pair_column`` for
    sentence pairs) hold the inputs, ``label_column`` the class. ``label_names`` is the public label set (None: the
    schema's, or with ``label_names_from_private_data`` the training rows', which ε does not cover). A causal LM's
    prompt → completion data names ``prompt_column`` and ``completion_column`` instead (no labels)."""

    dataset_name: str | None = None
    dataset_config_name: str | None = None
    train_file: str | None = None
    validation_file: str | None = None
    test_file: str | None = None
    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"
    label_names: tuple[str, ...] | None = None
    label_names_from_private_data: bool = False
    prompt_column: str | None = None
    completion_column: str | None = None

    @property
    def is_generative(self) -> bool:
        return self.prompt_column is not None

    @property
    def files(self) -> dict[str, str]:
        """``{split: path}`` of the files given."""
        return {name.removesuffix("_file"): path for name in SPLIT_FILES if (path := getattr(self, name))}

    @property
    def text_columns(self) -> tuple[str, ...]:
        return (self.text_column,) if self.text_pair_column is None else (self.text_column, self.text_pair_column)

    def save(self, run_dir: str | os.PathLike) -> Path:
        """Write ``<run_dir>/dataset.json`` with absolute paths (it stays on the training machine)."""
        data = asdict(self)
        for name in SPLIT_FILES:
            data[name] = data[name] and str(Path(data[name]).resolve())
        if self.dataset_name and Path(self.dataset_name).is_dir():
            data["dataset_name"] = str(Path(self.dataset_name).resolve())
        return write_text_atomic(Path(run_dir) / DATASET_SOURCE_NAME, json.dumps(data, indent=2) + "\n")

    @classmethod
    def load(cls, run_dir: str | os.PathLike) -> DatasetSource | None:
        """The source saved in ``run_dir`` (None for a packaged or GLUE task's run)."""
        path = Path(run_dir) / DATASET_SOURCE_NAME
        if not path.is_file():
            return None
        data = json.loads(path.read_text())
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(data) - known):
            raise ValueError(f"{path}: unknown keys {unknown}; written by a newer hf_dpmerge?")
        if data.get("label_names") is not None:
            data["label_names"] = tuple(data["label_names"])
        return cls(**data)
