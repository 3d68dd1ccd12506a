"""The Hub model card: metadata, privacy section, merge recipe and the evaluation, from the template."""

from __future__ import annotations

import dataclasses
import math

import pytest
from huggingface_hub import ModelCard

from hf_dpmerge.analysis.evaluation_report import EvaluationReport, TaskEvaluation
from hf_dpmerge.hub.causal_release import causal_model_card
from hf_dpmerge.hub.model_card import HeadInfo, MergeRecipe, build_model_card
from hf_dpmerge.records.card import hub_model_id
from hf_dpmerge.records.record import PrivacyRecord
from tests.utils.records import privacy_record


def _record(task: str, epsilon: float = 3.0, dp: bool = True) -> PrivacyRecord:
    return privacy_record(task, math.inf if not dp else epsilon, dp=dp, extra={"dataset_hub_id": "nyu-mll/glue"})


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
    assert reparsed.data.tags == ["hf_dpmerge", "differential-privacy", "merge", "mergekit", "peft", "lora"]
    assert reparsed.data.library_name == "transformers" and reparsed.data.pipeline_tag == "text-classification"
    assert reparsed.data.base_model_relation == "merge" and reparsed.data.datasets == ["nyu-mll/glue"]
    text = reparsed.text
    assert "| sst2 | 1.5 | not computed | 1e-05 | rdp |" in text and "(ε = 4, δ = 1e-05)-DP" in text
    assert "```yaml\nmerge_method: ties\nbase_model: org/base\n```" in text
    assert "| sst2 | 2 | neg, pos |" in text and "| qnli | 2 | – |" in text
    assert "No evaluation results were given." in text
    assert 'pipeline("text-classification", model="bob/m", model_kwargs={"subfolder": "sst2"}' in text
    assert "head.safetensors" not in text  # each task folder holds its whole model


def test_card_of_a_release_with_one_shared_encoder_says_where_it_is():
    card = build_model_card({"sst2": _record("sst2", 1.5)}, repo_id="bob/m", heads={"sst2": HeadInfo("sst2", 2)},
                            shared_encoder=True)
    assert "as its head (`head.safetensors`)" in card.text and "stored once for every task" in card.text
    assert "the subfolder's config names the root's `model.safetensors`" in card.text


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
    # huggingface_hub's own rule decides what can be a Hub id (validate_repo_id), not a look-alike regex
    assert hub_model_id("org--name/model") is None and hub_model_id("a/b/c") is None
    assert hub_model_id("user/model.git") is None and hub_model_id("x" * 97) is None


def test_merge_recipe(tmp_path):
    assert MergeRecipe.load(tmp_path).text is None
    (tmp_path / "mergekit_config.yml").write_text("merge_method: dare_ties\n# comment dropped\n")
    recipe = MergeRecipe.load(tmp_path)
    assert recipe.method == "dare_ties" and recipe.text == "merge_method: dare_ties\n"
    other = tmp_path / "other.yaml"
    other.write_text("merge_method: [unclosed\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        MergeRecipe.load(tmp_path, other)
    with pytest.raises(FileNotFoundError):
        MergeRecipe.load(tmp_path, tmp_path / "missing.yml")


CONFIG = """# λ validation-tuned 2026-12-01 with benchmarks/tune_scale.py (a dated note)
merge_method: dp_aware
models:
  - model: ./runs/base+./runs/a # the first task
    parameters: {label: 'x # not a comment', note: "q\\" # r"}  # both quoted
parameters:
  # grid {0.1, 0.3, 0.5, 1}
  lambda: 0.5
  consensus: none # or precision_sign
  tag: it's#kept
"""


@pytest.mark.parametrize("block", ["", "  text: |\n    line # in a block scalar\n"])
def test_the_cards_merge_section_quotes_the_configuration_without_its_comments(tmp_path, block):
    """The YAML the card quotes says what the file says, '#' inside quotes and plain scalars kept, and no comment
    (a dated tuning note is no configuration); a block scalar holding ' #' falls back to the data dumped."""
    import yaml

    (tmp_path / "merge.yml").write_text(CONFIG + block)
    recipe = MergeRecipe.load(tmp_path, tmp_path / "merge.yml")
    assert yaml.safe_load(recipe.text) == yaml.safe_load(CONFIG + block) and recipe.method == "dp_aware"
    assert "x # not a comment" in recipe.text and "it's#kept" in recipe.text
    text = build_model_card({"sst2": _record("sst2")}, repo_id="bob/m", merge=recipe).text
    quoted = text.partition("```yaml\n")[2].partition("```")[0]
    assert quoted == recipe.text
    for comment in ("2026-12-01", "grid", "the first task", "both quoted", "precision_sign"):
        assert comment not in quoted
    if not block:  # the layout is kept
        assert "  consensus: none\n  tag: it's#kept\n" in quoted and quoted.startswith("merge_method: dp_aware\n")


def _report() -> EvaluationReport:
    return EvaluationReport(
        tasks=[TaskEvaluation("sst2", "accuracy", 1.5, 1e-5, 0.9, 0.81, 872),
               TaskEvaluation("qnli", "accuracy", float("inf"), None, 0.0, 0.5, 100)],
        merged_model="/home/me/merged", base_model="/home/me/runs/base", max_eval_samples=None,
    )


def test_evaluation_goes_into_the_table_and_the_eval_results_without_local_paths():
    card = build_model_card({"sst2": _record("sst2", 1.5), "qnli": _record("qnli", 4.0)}, repo_id="bob/m",
                            evaluation=_report(), base_model="/home/me/runs/base")
    reparsed = ModelCard(str(card))
    assert "| sst2 | accuracy | 1.5 | – | 0.9000 | 0.8100 | – | 90.0% | +0.0900 | 872 |" in reparsed.text
    assert "| qnli | accuracy | ∞ | – | 0.0000 | 0.5000 | – | – | -0.5000 | 100 |" in reparsed.text
    results = {r.dataset_name: r for r in reparsed.data.eval_results}
    assert results["sst2"].metric_value == 0.81 and results["sst2"].dataset_type == "nyu-mll/glue"
    assert reparsed.data.base_model is None and "/home/me" not in str(card)
    assert {r.dataset_split for r in reparsed.data.eval_results} == {"test"}


def _card_columns(text: str) -> list[str]:
    """The card's evaluation column definitions (its "- **label**: definition" lines) as "label: definition"."""
    section = text.partition("## Evaluation")[2]
    return [line[4:].replace("**: ", ": ", 1) for line in section.splitlines() if line.startswith("- **")]


@pytest.mark.parametrize("floor_runs", [False, True])
def test_the_card_defines_its_columns_as_evaluates_legend_and_carries_the_own_head(tmp_path, floor_runs):
    """The merged card's column definitions are those evaluate prints under its table (and writes in
    results.json), the floor the private head where --floor_runs gave one; then the own head is a column too."""
    tasks = [TaskEvaluation("rotten_tomatoes", "accuracy", 8.0, 1e-5, 0.80, 0.78, 1066, floor=0.7635,
                            own_head=0.7682 if floor_runs else None)]
    report = EvaluationReport.load(EvaluationReport(tasks, "merged", "base", floor_kind="private_head" if floor_runs
                                                    else "own_head").save(tmp_path)[0])
    text = build_model_card({"rotten_tomatoes": _record("rotten_tomatoes", 8.0)}, repo_id="bob/m",
                            evaluation=report).text
    legend = [line for line in report.table().splitlines() if ": " in line]
    assert _card_columns(text) == legend and len(legend) == 9 + floor_runs
    floor = next(line for line in legend if line.startswith("floor: "))
    assert ("private head" in floor) == floor_runs and ("--floor_runs" in floor) == floor_runs
    section = text.partition("## Evaluation")[2].splitlines()
    header = next(line for line in section if line.startswith("| task |"))
    assert ("| own head |" in header) == floor_runs
    row = next(line for line in section if line.startswith("| rotten_tomatoes |"))
    assert ("| 0.7682 |" in row) == floor_runs and "| 0.7635 |" in row
    assert len(header.split("|")) == len(row.split("|"))


def test_model_index_names_the_split_the_scores_came_from():
    report = dataclasses.replace(_report(), split="validation")
    card = ModelCard(str(build_model_card({"sst2": _record("sst2", 1.5), "qnli": _record("qnli", 4.0)},
                                          repo_id="bob/m", evaluation=report)))
    assert {r.dataset_split for r in card.data.eval_results} == {"validation"}
    assert "validation split" in card.text


def _causal_evaluation(split: str) -> dict:
    row = {"metric": "accuracy", "epsilon": 3.0, "floor": 0.5, "individual": 0.8, "merged": 0.7,
           "gain_retained": 0.667, "retention": 0.875, "num_examples": 321}
    return {"model_kind": "causal_lm", "split": split, "tasks": {"sst2": row}}


@pytest.mark.parametrize("split", ["test", "validation"])
def test_every_evaluation_table_says_it_is_outside_the_guarantee(split):
    """The held-out metrics and split sizes are published without noise: the card says so under the table, on the
    encoder and the causal-LM release alike, and only when there is a table."""
    encoder = {"sst2": _record("sst2", 1.5), "qnli": _record("qnli", 4.0)}
    causal = {"sst2": privacy_record("sst2", extra={"model_kind": "causal_lm"})}
    merge = MergeRecipe(text=None, method=None, source=None)
    cards = {
        "encoder": build_model_card(encoder, repo_id="bob/m",
                                    evaluation=dataclasses.replace(_report(), split=split)).text,
        "causal": causal_model_card(causal, repo_id="bob/c", merge=merge, evaluation=_causal_evaluation(split)).text,
    }
    for kind, text in cards.items():
        table, _, after = text.partition("## Evaluation")[2].rpartition("|\n")
        note = after.split("\n## ")[0]
        assert "**Outside the guarantee.**" in note, kind
        assert f"held-out {split} split without noise. ε does not cover these numbers" in note, kind
        assert f"the size of each task's {split} split (examples) and the models' scores" in note, kind
    assert "`model-index`" in cards["encoder"] and "`model-index`" not in cards["causal"]
    for text in (build_model_card(encoder, repo_id="bob/m").text,
                 causal_model_card(causal, repo_id="bob/c", merge=merge).text):
        assert "No evaluation results were given." in text and "**Outside the guarantee.**" not in text


def test_evaluation_json_is_read_by_one_typed_reader(tmp_path):
    import json

    path = tmp_path / "results.json"
    path.write_text(json.dumps(_report().to_dict(), allow_nan=True))
    loaded = EvaluationReport.load(path)
    assert loaded.tasks[0] == _report().tasks[0] and math.isinf(loaded.tasks[1].epsilon)
    path.write_text(json.dumps({"a": {"individual": 0.9}}))
    with pytest.raises(ValueError, match="results.json is not what `hf-dpmerge evaluate` writes"):
        EvaluationReport.load(path)
    path.write_text("[1, 2")
    with pytest.raises(ValueError, match="corrupt evaluation JSON"):
        EvaluationReport.load(path)


def test_base_model_comes_from_the_encoder_training_started_from():
    records = {t: privacy_record(t, base_model="/home/me/runs/base",
                                 extra={"base_model_hub_id": "sentence-transformers/all-MiniLM-L6-v2"})
               for t in ("sst2", "qnli")}
    card = ModelCard(str(build_model_card(records, repo_id="bob/m")))
    assert card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert card.data.base_model_relation == "merge" and "/home/me" not in str(card)


def test_a_task_trained_without_the_answers_end_is_marked_in_the_table_and_under_usage():
    records = {"sst2": privacy_record("sst2", extra={"model_kind": "causal_lm", "verbalisers": ["bad", "good"],
                                                     "train_answer_end": False}),
               "rte": privacy_record("rte", extra={"model_kind": "causal_lm", "verbalisers": ["yes", "no"]})}
    evaluation = _causal_evaluation("test")
    evaluation["tasks"] = {"sst2": {**evaluation["tasks"]["sst2"], "answer_end_scored": False},
                           "rte": evaluation["tasks"]["sst2"]}
    text = causal_model_card(records, repo_id="bob/c", merge=MergeRecipe(text=None, method=None, source=None),
                             evaluation=evaluation).text
    assert "| sst2 † | accuracy |" in text and "| rte | accuracy |" in text
    assert "† Scored on the verbaliser's tokens alone, for every model" in text
    usage = text.partition("## Usage")[2]
    assert "- `sst2`: bad, good (its adapter was trained without the end of the answer" in usage
    assert "- `rte`: yes, no\n" in usage
    plain = causal_model_card({"rte": records["rte"]}, repo_id="bob/c",
                              merge=MergeRecipe(text=None, method=None, source=None),
                              evaluation=_causal_evaluation("test")).text
    assert "†" not in plain and "without the end of the answer" not in plain
