"""The Hub model card: metadata, privacy section, merge recipe and the generic evaluation table."""

from __future__ import annotations

import math

import pytest
from huggingface_hub import ModelCard

from hub_helpers import privacy_record

from hf_dpmerge.hub.model_card import (
    HeadInfo,
    MergeRecipe,
    build_model_card,
    evaluation_table,
    hub_model_id,
)
from hf_dpmerge.privacy.record import PrivacyRecord


def _record(task: str, epsilon: float = 3.0, dp: bool = True) -> PrivacyRecord:
    return privacy_record(task, math.inf if not dp else epsilon, dp=dp)


def test_card_metadata_and_sections():
    merge = MergeRecipe(text="merge_method: ties\nbase_model: org/base\n", method="ties", source="merge.yml")
    card = build_model_card(
        {"sst2": _record("sst2", 1.5), "qnli": _record("qnli", 4.0)},
        repo_id="bob/m",
        merge=merge,
        heads={"sst2": HeadInfo("sst2", 2, ["neg", "pos"]), "qnli": HeadInfo("qnli", 2)},
        license="mit",
    )
    reparsed = ModelCard(str(card))
    assert reparsed.data.license == "mit" and reparsed.data.base_model == "org/base"
    assert reparsed.data.tags == ["hf_dpmerge", "differential-privacy", "merge", "lora"]
    assert reparsed.data.library_name == "transformers"
    text = reparsed.text
    assert "| sst2 | 1.5 | 1e-05 | rdp | 1600 |" in text and "(4, 1e-05)-DP" in text
    assert "```yaml\nmerge_method: ties\nbase_model: org/base\n```" in text
    assert "| sst2 | 2 | neg, pos |" in text and "| qnli | 2 | – |" in text
    assert "No evaluation results were given." in text
    assert 'pipeline("text-classification", model="bob/m", model_kwargs={"subfolder": "sst2"}' in text


def test_card_without_dp_input_claims_no_guarantee():
    card = build_model_card({"a": _record("a"), "b": _record("b", dp=False)}, repo_id="bob/m")
    assert "**no** differential-privacy guarantee" in card.text
    assert "No merge configuration was found" in card.text
    assert "differentially private (DP-SGD)" not in card.text


def test_card_needs_records():
    with pytest.raises(ValueError, match="at least one adapter"):
        build_model_card({})


def test_hub_model_id(tmp_path):
    (tmp_path / "runs" / "base").mkdir(parents=True)
    assert hub_model_id("sentence-transformers/all-MiniLM-L6-v2") == "sentence-transformers/all-MiniLM-L6-v2"
    assert hub_model_id("bert-base-uncased") == "bert-base-uncased"
    assert hub_model_id("/abs/path/model") is None
    assert hub_model_id("./models/x") is None
    assert hub_model_id("runs/base", local_roots=[tmp_path]) is None
    assert hub_model_id("runs/other", local_roots=[tmp_path]) is None  # runs/ is local even if base moved
    assert hub_model_id(None) is None


def test_merge_recipe(tmp_path):
    assert MergeRecipe.load(tmp_path).text is None
    (tmp_path / "mergekit_config.yml").write_text("merge_method: dare_ties\n# comment kept\n")
    recipe = MergeRecipe.load(tmp_path)
    assert recipe.method == "dare_ties" and "# comment kept" in recipe.text
    other = tmp_path / "other.yaml"
    other.write_text("merge_method: [unclosed\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        MergeRecipe.load(tmp_path, other)
    with pytest.raises(FileNotFoundError):
        MergeRecipe.load(tmp_path, tmp_path / "missing.yml")


@pytest.mark.parametrize(
    "data",
    [
        {"a": {"individual": 0.9, "merged": 0.8}, "b": {"merged": 0.7, "retention": 1.0}, "mean": {"merged": 0.75}},
        {"tasks": [{"task": "a", "individual": 0.9, "merged": 0.8}, {"task": "b", "merged": 0.7, "retention": 1.0}],
         "mean": {"merged": 0.75}},
        {"per_task": {"a": {"individual": 0.9, "merged": 0.8}, "b": {"merged": 0.7, "retention": 1.0}},
         "mean": {"merged": 0.75}},
    ],
)
def test_evaluation_table_shapes(data):
    table = evaluation_table(data, tasks=["a", "b"])
    assert "| task | individual | merged | retention |" in table
    assert "| a | 0.9 | 0.8 | – |" in table
    assert "| b | – | 0.7 | 1 |" in table
    assert "| **mean** | – | 0.75 | – |" in table


def test_evaluation_table_nested_and_other_entries():
    data = {
        "a": {"individual": {"accuracy": 0.5, "f1": None}, "merged": {"accuracy": float("nan")}, "note": "x|y"},
        "config": {"seed": 1},
        "metric": "accuracy",
        "chart": "eval.png",
    }
    table = evaluation_table(data, tasks=["a"])
    assert "| task | individual.accuracy | individual.f1 | merged.accuracy | note |" in table
    assert "| a | 0.5 | – | nan | x\\|y |" in table
    assert "config" not in table.split("\n\n")[0]  # not a task when task names match
    assert "- metric: accuracy" in table and "- chart: eval.png" in table


def test_evaluation_table_without_rows_shows_json():
    assert "```json" in evaluation_table([1, 2, 3])
    assert "```json" in evaluation_table({"only": "scalars"})
