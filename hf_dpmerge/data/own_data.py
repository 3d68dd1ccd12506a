"""A user's own classification dataset (:class:`~hf_dpmerge.data.dataset_source.DatasetSource`) as a task: its rows
read with ``datasets``' own loaders, checked, and its :class:`~hf_dpmerge.data.tasks.TaskSpec` built.

Every check runs before training writes anything, and no message quotes a row: the rows are private. The label set
is part of the release (the head's ``id2label``), so it comes from ``--label_names`` or a ``ClassLabel`` schema; from
the training rows only with ``--label_names_from_private_data`` (outside ε: the record and card say so). Integer
labels index the label names; string labels name them (docs/workflow.md "Your own data"). A causal LM's prompt →
completion dataset (:func:`own_completion_task`) has no label set: its rows become ``prompt`` and ``completion``.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import datasets

from hf_dpmerge.data.dataset_source import (
    LABELS_FROM_PRIVATE_DATA,
    LABELS_FROM_SCHEMA,
    LABELS_FROM_USER,
    DatasetSource,
)
from hf_dpmerge.data.tasks import OWN, TOKEN_ACCURACY, TaskSpec

FILE_BUILDERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
NO_LABEL_SET = ("the label set is part of the release and may not come from the private rows unasked: pass "
                "--label_names (comma-separated, public), use a dataset whose label column is a ClassLabel, or opt "
                "in with --label_names_from_private_data true (not covered by ε; the card says so)")


def _check_file(flag: str, path: str) -> str:
    """The ``datasets`` builder of ``path``, after checking it exists, is UTF-8 and has no repeated column."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"--{flag} {path}: no such file")
    builder = FILE_BUILDERS.get(file.suffix.lower())
    if builder is None:
        raise ValueError(f"--{flag} {path}: unsupported extension {file.suffix or '(none)'!r}; give a .csv, .json, "
                         ".jsonl or .parquet file")
    if builder != "parquet":
        try:
            with file.open(encoding="utf-8") as handle:
                while handle.read(1 << 20):
                    pass
        except UnicodeDecodeError as err:
            raise ValueError(f"--{flag} {path}: not UTF-8 text (byte {err.start}); re-save it as UTF-8") from None
    if builder == "csv":
        with file.open(encoding="utf-8", newline="") as handle:
            header = next(csv.reader(handle), [])
        if repeated := sorted({name for name in header if header.count(name) > 1}):
            raise ValueError(f"--{flag} {path}: column {', '.join(map(repr, repeated))} appears more than once in "
                             "its header; rename the copies")
    return builder


@contextmanager
def _quiet_loading() -> Iterator[None]:
    """``datasets``' progress bars off while a user's few files are read (restored after)."""
    was_on = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_on:
            datasets.enable_progress_bars()


def read_dataset(source: DatasetSource) -> datasets.DatasetDict:
    """The splits the source has (``train`` at least), as ``datasets`` loads them."""
    with _quiet_loading():
        return _read_dataset(source)


def _read_dataset(source: DatasetSource) -> datasets.DatasetDict:
    if source.dataset_name and source.files:
        raise ValueError("give --dataset_name or --train_file/--validation_file/--test_file, not both")
    if source.files:
        if "train" not in source.files:
            raise ValueError("--validation_file/--test_file need a --train_file")
        builders = {_check_file(f"{split}_file", path) for split, path in source.files.items()}
        if len(builders) > 1:
            raise ValueError("--train_file, --validation_file and --test_file must have one format (csv, json/jsonl "
                             "or parquet)")
        try:
            loaded = datasets.load_dataset(builders.pop(), data_files=source.files)
        except datasets.exceptions.DatasetGenerationError as err:
            raise ValueError(f"the data files could not be read ({err.__cause__ or err})") from None
    elif source.dataset_name:
        loaded = _named_dataset(source)
    else:
        raise ValueError("no dataset: pass --task (a packaged or GLUE task), --dataset_name or --train_file")
    if isinstance(loaded, datasets.Dataset):
        loaded = datasets.DatasetDict(train=loaded)
    if "train" not in loaded:
        raise ValueError(f"--dataset_name {source.dataset_name}: no 'train' split (found {sorted(loaded)})")
    return loaded


def _named_dataset(source: DatasetSource) -> datasets.DatasetDict | datasets.Dataset:
    """A local ``save_to_disk`` folder, else a Hub dataset (an offline or unknown id: one clear error)."""
    name = source.dataset_name
    if Path(name).is_file():
        raise ValueError(f"--dataset_name {name} is a file: pass it as --train_file {name}")
    if Path(name).is_dir():
        if source.dataset_config_name:
            raise ValueError(f"--dataset_config_name applies to Hub datasets; {name} is a local save_to_disk folder")
        try:
            return datasets.load_from_disk(name)
        except FileNotFoundError:
            raise FileNotFoundError(f"--dataset_name {name}: a folder but no datasets.save_to_disk output") from None
    try:
        return datasets.load_dataset(name, source.dataset_config_name)
    except (ConnectionError, FileNotFoundError, datasets.exceptions.DatasetNotFoundError) as err:
        raise FileNotFoundError(f"--dataset_name {name}: not a local folder and not loadable from the Hub "
                                f"({type(err).__name__}; offline?); pass a local copy or --train_file") from None


def _check_columns(splits: datasets.DatasetDict, source: DatasetSource, extra: tuple[str, ...]) -> None:
    if source.is_generative:
        texts = [("--prompt_column", source.prompt_column), ("--completion_column", source.completion_column)]
        wanted = texts
    else:
        texts = [("--text_column", column) for column in source.text_columns]
        wanted = [("--text_column", source.text_column), ("--text_pair_column", source.text_pair_column),
                  ("--label_column", source.label_column)]
    wanted += [("--privacy_unit_column", column) for column in extra]
    for split, rows in splits.items():
        for flag, column in wanted:
            if column is not None and column not in rows.column_names:
                raise ValueError(f"{flag} {column}: no such column in the {split} split (columns found: "
                                 f"{', '.join(rows.column_names)})")
        for flag, column in texts:
            feature = rows.features[column]
            if not (isinstance(feature, datasets.Value) and "string" in feature.dtype):
                raise ValueError(f"{flag} {column}: the {split} split holds {feature}, not text")
            empty = sum(1 for text in rows[column] if text is None or not text.strip())
            if empty:
                raise ValueError(f"the {split} split has {empty} row(s) whose {column!r} is empty or null: remove or "
                                 "fill them")


def _label_names(splits: datasets.DatasetDict, source: DatasetSource) -> tuple[tuple[str, ...], str]:
    """The label names and where they came from (:data:`LABELS_FROM_USER` …)."""
    feature = splits["train"].features[source.label_column]
    if isinstance(feature, datasets.ClassLabel):
        if source.label_names is not None and tuple(source.label_names) != tuple(feature.names):
            raise ValueError(f"--label_names {','.join(source.label_names)} differ from the dataset's ClassLabel "
                             f"names {','.join(feature.names)}: drop --label_names or match them")
        names, origin = tuple(feature.names), LABELS_FROM_SCHEMA
    elif source.label_names is not None:
        names, origin = tuple(source.label_names), LABELS_FROM_USER
    elif source.label_names_from_private_data:
        values = sorted({value for value in splits["train"][source.label_column] if value is not None})
        names, origin = tuple(str(value) for value in values), LABELS_FROM_PRIVATE_DATA
    else:
        raise ValueError(NO_LABEL_SET)
    if len(set(names)) != len(names):
        raise ValueError(f"--label_names repeats a name ({','.join(names)})")
    if len(names) < 2:
        where = "the training rows hold" if origin == LABELS_FROM_PRIVATE_DATA else f"{origin} gives"
        raise ValueError(f"{where} {len(names)} label: a classifier needs at least two classes")
    return names, origin


def _encoded_labels(rows: datasets.Dataset, split: str, source: DatasetSource, names: tuple[str, ...],
                    origin: str) -> list[int]:
    """Each row's class index; a null, fractional or unknown label is refused with a count (never its value)."""
    feature = rows.features[source.label_column]
    values = rows[source.label_column]
    if isinstance(feature, datasets.ClassLabel):
        return values
    if isinstance(feature, datasets.Value) and "float" in feature.dtype:
        fractional = sum(1 for v in values if v is not None and not math.isnan(v) and v != int(v))
        if fractional:
            raise ValueError(f"--label_column {source.label_column}: {fractional} row(s) of the {split} split hold "
                             "fractional numbers; classes are strings or integers (regression is not supported)")
        values = [None if v is None or math.isnan(v) else int(v) for v in values]
    if nulls := sum(1 for v in values if v is None):
        raise ValueError(f"the {split} split has {nulls} row(s) without a label in {source.label_column!r}")
    if origin != LABELS_FROM_PRIVATE_DATA and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        codes = [v if 0 <= v < len(names) else -1 for v in values]  # integers index the public label names
    else:
        index = {name: i for i, name in enumerate(names)}
        codes = [index.get(str(v), -1) for v in values]
    if outside := codes.count(-1):
        raise ValueError(f"the {split} split has {outside} row(s) whose label is not one of the {len(names)} label "
                         "names (values not shown: they are private data); fix the rows or --label_names")
    return codes


def own_task(source: DatasetSource, name: str, keep_columns: tuple[str, ...] = (),
             loaded: datasets.DatasetDict | None = None) -> tuple[dict[str, datasets.Dataset], TaskSpec]:
    """The checked splits of the source (or of the ``loaded`` splits, read from it already), ``label`` encoded as a
    ``ClassLabel``, the text columns and ``keep_columns`` kept, and the task's spec; missing validation/test splits
    are carved later by :func:`hf_dpmerge.data.load.load_task`."""
    loaded = read_dataset(source) if loaded is None else loaded
    unknown = sorted(set(loaded) - {"train", "validation", "test"})
    if unknown:
        raise ValueError(f"split(s) {unknown} are not train, validation or test; rename them")
    _check_columns(loaded, source, keep_columns)
    if source.is_generative:
        return own_completion_task(loaded, source, name, keep_columns)
    names, origin = _label_names(loaded, source)
    spec = TaskSpec(name, len(names), names, source.text_columns, "accuracy", OWN,
                    description=f"own data; label names from {origin}", dataset=source, label_origin=origin)
    features = datasets.Features({**{c: datasets.Value("string") for c in (*source.text_columns, *keep_columns)},
                                  "label": datasets.ClassLabel(names=list(names))})
    splits = {}
    for split, rows in loaded.items():
        codes = _encoded_labels(rows, split, source, names, origin)
        table = {column: rows[column] for column in (*source.text_columns, *keep_columns)}
        if any(isinstance(rows.features[c], datasets.Value) and "string" not in rows.features[c].dtype
               for c in keep_columns):
            table = {c: [None if v is None else str(v) for v in values] for c, values in table.items()}
        splits[split] = datasets.Dataset.from_dict({**table, "label": codes}, features=features)
    return splits, spec


def own_completion_task(loaded: datasets.DatasetDict, source: DatasetSource, name: str,
                        keep_columns: tuple[str, ...] = ()) -> tuple[dict[str, datasets.Dataset], TaskSpec]:
    """A checked prompt → completion dataset's splits (columns ``prompt``, ``completion`` and ``keep_columns``) and
    its spec (no labels, :data:`~hf_dpmerge.data.tasks.TOKEN_ACCURACY`)."""
    spec = TaskSpec(name, 0, (), ("prompt",), TOKEN_ACCURACY, OWN, description="own data; prompt → completion",
                    dataset=source)
    features = datasets.Features({c: datasets.Value("string") for c in ("prompt", "completion", *keep_columns)})
    splits = {}
    for split, rows in loaded.items():
        table = {"prompt": rows[source.prompt_column], "completion": rows[source.completion_column],
                 **{c: [None if v is None else str(v) for v in rows[c]] for c in keep_columns}}
        splits[split] = datasets.Dataset.from_dict(table, features=features)
    return splits, spec
