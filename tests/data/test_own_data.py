"""A user's own dataset as a task (hf_dpmerge.data.own_data): labels from public information only, splits carved by
the seeded rule, and mistakes refused without quoting a private row."""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pytest

from hf_dpmerge.data.dataset_source import (
    LABELS_FROM_PRIVATE_DATA,
    LABELS_FROM_SCHEMA,
    LABELS_FROM_USER,
    DatasetSource,
)
from hf_dpmerge.data.load import TEST_FRACTION, load_task
from hf_dpmerge.data.splits import stratified_split


def rows(n: int = 60, labels: tuple = ("neg", "pos")) -> pd.DataFrame:
    return pd.DataFrame({"text": [f"note number {i}" for i in range(n)], "label": [labels[i % len(labels)]
                                                                                 for i in range(n)]})


def csv_file(tmp_path: Path, frame: pd.DataFrame, name: str = "own.csv") -> str:
    frame.to_csv(tmp_path / name, index=False)
    return str(tmp_path / name)


def test_string_labels_are_encoded_in_the_order_of_label_names_and_missing_splits_are_carved(tmp_path) -> None:
    source = DatasetSource(train_file=csv_file(tmp_path, rows()), label_names=("pos", "neg"))
    splits, spec = load_task("mine", source=source)
    assert spec.label_names == ("pos", "neg") and spec.label_origin == LABELS_FROM_USER
    assert spec.carved_splits == ("validation", "test")
    assert splits["train"].features["label"].names == ["pos", "neg"]
    texts = {split: splits[split]["text"] for split in splits}
    assert sum(map(len, texts.values())) == 60 and not set(texts["train"]) & set(texts["test"])
    # the test split is the seeded stratified rule's, as for packaged tasks without one
    codes = np.array([1 if i % 2 == 0 else 0 for i in range(60)])
    held = stratified_split(codes, TEST_FRACTION, 42)[1]
    assert sorted(texts["test"]) == sorted(f"note number {i}" for i in held)
    for split in splits.values():  # every row's class is its own
        for text, label in zip(split["text"], split["label"], strict=True):
            assert label == (1 if int(text.split()[-1]) % 2 == 0 else 0)


def test_given_validation_and_test_files_are_used_as_they_are(tmp_path) -> None:
    source = DatasetSource(train_file=csv_file(tmp_path, rows(40)), label_names=("neg", "pos"),
                           validation_file=csv_file(tmp_path, rows(6), "val.csv"),
                           test_file=csv_file(tmp_path, rows(8), "test.csv"))
    splits, spec = load_task("mine", source=source)
    assert (len(splits["train"]), len(splits["validation"]), len(splits["test"])) == (40, 6, 8)
    assert spec.carved_splits == ()


def test_integer_labels_index_the_label_names_and_a_classlabel_schema_names_itself(tmp_path) -> None:
    frame = pd.DataFrame({"text": [f"t {i}" for i in range(30)], "label": [i % 3 for i in range(30)]})
    frame.to_json(tmp_path / "own.jsonl", orient="records", lines=True)
    splits, spec = load_task("ints", source=DatasetSource(train_file=str(tmp_path / "own.jsonl"),
                                                          label_names=("a", "b", "c")))
    assert spec.num_labels == 3 and splits["train"][0]["label"] == int(splits["train"][0]["text"].split()[1]) % 3

    schema = datasets.Dataset.from_dict({"sentence": [f"s {i}" for i in range(30)], "y": [i % 2 for i in range(30)]},
                                        features=datasets.Features({"sentence": datasets.Value("string"),
                                                                    "y": datasets.ClassLabel(names=["no", "yes"])}))
    schema.save_to_disk(str(tmp_path / "saved"))
    _, spec = load_task("schema", source=DatasetSource(dataset_name=str(tmp_path / "saved"), text_column="sentence",
                                                       label_column="y"))
    assert spec.label_names == ("no", "yes") and spec.label_origin == LABELS_FROM_SCHEMA


def test_the_label_set_comes_from_the_rows_only_when_asked_and_says_so(tmp_path) -> None:
    path = csv_file(tmp_path, rows(30, ("zeta", "alpha", "mu")))
    with pytest.raises(ValueError, match="label set is part of the release"):
        load_task("mine", source=DatasetSource(train_file=path))
    _, spec = load_task("mine", source=DatasetSource(train_file=path, label_names_from_private_data=True))
    assert spec.label_names == ("alpha", "mu", "zeta") and spec.label_origin == LABELS_FROM_PRIVATE_DATA


def test_sentence_pairs_keep_both_texts(tmp_path) -> None:
    frame = pd.DataFrame({"premise": [f"p {i}" for i in range(30)], "hypothesis": [f"h {i}" for i in range(30)],
                          "label": ["yes", "no"] * 15})
    source = DatasetSource(train_file=csv_file(tmp_path, frame), text_column="premise", text_pair_column="hypothesis",
                           label_names=("no", "yes"))
    splits, spec = load_task("pairs", source=source)
    assert spec.is_pair and spec.text_columns == ("premise", "hypothesis")
    assert set(splits["train"].column_names) == {"premise", "hypothesis", "label"}


def test_a_label_outside_the_set_is_counted_never_quoted(tmp_path) -> None:
    frame = rows(40)
    frame.loc[[3, 7], "label"] = "RARE-DIAGNOSIS-X17"
    with pytest.raises(ValueError) as err:
        load_task("mine", source=DatasetSource(train_file=csv_file(tmp_path, frame), label_names=("neg", "pos")))
    assert "2 row(s)" in str(err.value) and "RARE-DIAGNOSIS" not in str(err.value)


def test_a_file_given_as_dataset_name_is_pointed_to_train_file(tmp_path) -> None:
    path = csv_file(tmp_path, rows())
    with pytest.raises(ValueError, match="is a file: pass it as --train_file"):
        load_task("mine", source=DatasetSource(dataset_name=path, label_names=("neg", "pos")))
