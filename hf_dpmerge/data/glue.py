"""GLUE through ``datasets`` (the Hub path for online users): raw train and test splits.

GLUE's test labels are hidden, so its validation split (``validation_matched`` for MNLI) serves as test.
``path`` is the dataset repository (``nyu-mll/glue``) or a local directory laid out the same way (one
folder of parquet files per task and a README whose ``configs`` name them), which the tests use offline.
"""

from __future__ import annotations

import os

import datasets

from hf_dpmerge.data.tasks import TaskSpec

GLUE_PATH = "nyu-mll/glue"
_TEST_SPLIT = {"mnli": "validation_matched"}


def load_glue(spec: TaskSpec, *, path: str | os.PathLike = GLUE_PATH,
              cache_dir: str | os.PathLike | None = None) -> tuple[datasets.Dataset, datasets.Dataset]:
    """``(train, test)`` for a GLUE task, keeping only its text columns and ``label``."""
    raw = datasets.load_dataset(str(path), spec.name, cache_dir=None if cache_dir is None else str(cache_dir))
    test_split = _TEST_SPLIT.get(spec.name, "validation")
    missing = [split for split in ("train", test_split) if split not in raw]
    if missing:
        raise ValueError(f"{path} ({spec.name}) has no split(s) {missing}; found {sorted(raw)}")
    keep = [*spec.text_columns, "label"]
    out = []
    for split in ("train", test_split):
        part = raw[split]
        absent = [c for c in keep if c not in part.column_names]
        if absent:
            raise ValueError(f"{path} ({spec.name}/{split}) lacks columns {absent}; has {part.column_names}")
        label = part.features["label"]
        if isinstance(label, datasets.ClassLabel) and tuple(label.names) != spec.label_names:
            raise ValueError(f"{path} ({spec.name}) labels {label.names} differ from {list(spec.label_names)}")
        out.append(part.select_columns(keep))
    return out[0], out[1]
