"""Own data in train_causal_lm.py: the classifier script's flags and checks plus --verbalizers; each mistake ends in
one line, exit 2, before anything is written; an own CSV trains a causal adapter that hf-dpmerge evaluate scores
through the run's dataset.json (slow)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from hf_dpmerge.analysis.task_run import task_runs
from hf_dpmerge.data.dataset_source import DatasetSource
from hf_dpmerge.data.instructions import instruction_format
from hf_dpmerge.records.record import PrivacyRecord
from hf_dpmerge.scripts.train_causal_lm import SCRIPT, main, plan_causal_runs
from hf_dpmerge.utils.user_errors import run_script
from tests.utils.tiny_models import CORPUS, save_tiny_llama

OWN = ["--train_file", "reviews.csv", "--label_names", "neg,pos"]
COMPLETION = ["--train_file", "qa.jsonl", "--prompt_column", "question", "--completion_column", "answer"]
SMALL_BATCH = ["--per_device_train_batch_size", "16", "--physical_batch_size", "8"]


def reviews(n: int) -> pd.DataFrame:
    """``n`` rows of the tiny tokenizer's words, labels neg/pos alternating."""
    return pd.DataFrame({"text": [CORPUS[i % len(CORPUS)] for i in range(n)],
                         "label": [("neg", "pos")[i % 2] for i in range(n)]})


@pytest.fixture
def own_csv(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    reviews(150).to_csv("reviews.csv", index=False)
    questions(150).to_json("qa.jsonl", orient="records", lines=True)
    return tmp_path


def questions(n: int) -> pd.DataFrame:
    """``n`` prompt → completion rows of the tiny tokenizer's words."""
    return pd.DataFrame({"question": [CORPUS[i % len(CORPUS)] for i in range(n)],
                         "answer": [CORPUS[(i + 1) % len(CORPUS)] for i in range(n)]})


def test_own_data_plans_the_label_names_with_the_given_answer_words_and_writes_nothing(own_csv: Path) -> None:
    plan = plan_causal_runs([*OWN, "--verbalizers", "rotten, fresh", *SMALL_BATCH])
    splits, spec = plan.data["reviews"]
    assert spec.label_names == ("neg", "pos") and spec.verbalisers == ("rotten", "fresh")
    assert instruction_format(spec).question == "Which label fits: rotten or fresh?"
    assert sum(map(len, splits.values())) == 150 and spec.carved_splits == ("validation", "test")
    default = plan_causal_runs([*OWN, "--task_name", "rotten_tomatoes", *SMALL_BATCH]).data["rotten_tomatoes"].spec
    assert instruction_format(default).verbalisers == ("neg", "pos")  # the label names, not the packaged task's
    assert sorted(p.name for p in own_csv.iterdir()) == ["qa.jsonl", "reviews.csv"]


def test_prompt_completion_data_plans_without_labels_with_the_recipe_fitted_to_its_rows(own_csv: Path) -> None:
    plan = plan_causal_runs(COMPLETION)
    splits, spec = plan.data["qa"]
    assert spec.is_generative and spec.metric == "token_accuracy" and spec.label_names == ()
    assert splits["train"].column_names == ["prompt", "completion"] and splits["train"].num_rows == 108
    config = plan.configs["qa"]
    assert config.per_device_train_batch_size == 108 and config.max_steps == 10  # q ≤ 1, steps ≥ 10
    assert config.learning_rate == pytest.approx(1e-2 * 12 / 10)  # as far as the recipe's 12 steps
    assert sorted(p.name for p in own_csv.iterdir()) == ["qa.jsonl", "reviews.csv"]


def mistakes(root: Path) -> list[tuple[list[str], str]]:
    """(train_causal_lm.py flags, what the one error line must say) for each mistake."""
    rare = reviews(150)
    rare.loc[7, "label"] = "RARE-DIAGNOSIS-X17"
    rare.to_csv(root / "rare.csv", index=False)
    return [
        ([*OWN, "--verbalizers", "rotten", *SMALL_BATCH], "--verbalizers gives 1 answer words for the 2 labels"),
        ([*OWN, "--verbalizers", "yes,yes", *SMALL_BATCH], "must be distinct and non-empty"),
        (["--task", "bbc_news", "--verbalizers", "a,b,c,d,e"], "--verbalizers gives an own dataset's answer words"),
        (["--train_file", "qa.jsonl", "--prompt_column", "question"], "--prompt_column and --completion_column go "
                                                                       "together"),
        ([*OWN, *COMPLETION], "--label_names describes labelled data; prompt → completion data has no labels"),
        (["--train_file", "qa.jsonl", "--prompt_column", "q", "--completion_column", "answer"],
         "--prompt_column q: no such column in the train split (columns found: question, answer)"),
        (["--task", "bbc_news", *COMPLETION[2:]], "--prompt_column describes an own dataset"),
        ([*OWN, "--per_device_train_batch_size", "500"], "reviews: the expected batch 500 exceeds the 108 training "
                                                         "rows: lower --per_device_train_batch_size"),
        (["--train_file", "rare.csv", "--label_names", "neg,pos", *SMALL_BATCH],
         "1 row(s) whose label is not one of the 2 label names"),
        (["--train_file", "reviews.csv", *SMALL_BATCH], "the label set is part of the release"),
        (["--task", "bbc_news", *OWN], "--task names a packaged or GLUE task"),
        ([*OWN, *SMALL_BATCH, "--privacy_unit_column", "patient"], "--privacy_unit_column patient: no such column"),
        (["--train_file", "missing.csv", "--label_names", "neg,pos"], "missing.csv: no such file"),
    ]


def test_each_mistake_ends_in_one_line_with_exit_status_2_and_writes_nothing(own_csv: Path, capsys) -> None:
    for flags, expected in mistakes(own_csv):
        with pytest.raises(SystemExit) as stopped:
            run_script(lambda flags=flags: main([*flags, "--runs_dir", "runs_causal"]), prog=SCRIPT)
        lines = capsys.readouterr().err.strip().splitlines()
        assert stopped.value.code == 2 and len(lines) == 1, (flags, lines)
        assert lines[0].startswith(f"{SCRIPT}: error: ") and expected in lines[0], (flags, lines[0])
        assert "RARE-DIAGNOSIS" not in lines[0]
    assert not (own_csv / "runs_causal").exists()


@pytest.mark.slow
def test_an_own_csv_trains_a_causal_adapter_that_evaluate_and_push_take_through_its_dataset_json(
        own_csv: Path) -> None:
    """The script's own test score and evaluate's individual score are the same rows scored by the same answer
    words, and evaluate's zero-shot floor is the base scored by them, not by the label names (whose words the tiny
    tokenizer does not know): evaluate rebuilt the task from dataset.json and the record's verbalisers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_dpmerge.analysis.causal_evaluation import task_score
    from hf_dpmerge.cli.main import main as hf_dpmerge

    base = save_tiny_llama(own_csv / "tiny-llama", initializer_range=0.5)  # a base whose answers vary by prompt
    flags = [*OWN, "--verbalizers", "rotten,fresh", "--model_name_or_path", str(base), *SMALL_BATCH, "--max_steps",
             "2", "--lora_r", "2", "--max_length", "32", "--lora_layers", "top_1", "--use_cpu", "true",
             "--disable_tqdm", "true"]
    splits, spec = plan_causal_runs(flags).data["reviews"]
    main(flags)
    run = own_csv / "runs_causal" / "reviews"
    record = PrivacyRecord.load(run / "adapter")
    assert record.extra["verbalisers"] == ["rotten", "fresh"] and record.extra["label_names"] == ["neg", "pos"]
    assert record.extra["label_names_from"] == "--label_names" and record.extra["carved_splits"] == ["validation",
                                                                                                    "test"]
    assert DatasetSource.load(run) == DatasetSource(train_file=str(own_csv / "reviews.csv"),
                                                    label_names=("neg", "pos"))
    assert not any(str(own_csv) in p.read_text(errors="ignore") for p in (run / "adapter").rglob("*") if p.is_file())
    assert task_runs(own_csv / "runs_causal")[0].spec.verbalisers == ("rotten", "fresh")

    config = yaml.safe_load((Path(__file__).parents[2] / "merge_configs" / "causal_task_arithmetic.yaml").read_text())
    config["models"] = [{"model": "./runs_causal/base+./runs_causal/reviews/adapter"}]
    (own_csv / "merge.yaml").write_text(yaml.safe_dump(config))
    assert hf_dpmerge(["merge", "merge.yaml", "merged", "--lora-merge-cache", "runs_causal/lora-cache",
                       "--quiet"]) == 0
    assert hf_dpmerge(["evaluate", "--runs", "runs_causal", "--merged", "merged", "--output", "eval"]) == 0
    row = json.loads((own_csv / "eval" / "results.json").read_text())["tasks"]["reviews"]
    trained = json.loads((run / "eval_metrics.json").read_text())["test"]["accuracy"]
    assert row["individual"] == pytest.approx(trained, abs=1e-12) and row["num_examples"] == 30
    model, tokenizer = AutoModelForCausalLM.from_pretrained(base).eval(), AutoTokenizer.from_pretrained(base)
    floors = [task_score(model, tokenizer, answered, splits["test"], 32)
              for answered in (spec, dataclasses.replace(spec, verbalisers=None))]
    assert row["floor"] == pytest.approx(floors[0], abs=1e-12) and floors[0] != floors[1]
    assert hf_dpmerge(["push", "merged", "--runs", "runs_causal", "--eval_json", "eval/results.json", "--dry-run",
                       "--staging_dir", "staged"]) == 0
    card = (own_csv / "staged" / "README.md").read_text()
    assert "`reviews`: rotten, fresh" in card and "Held-out splits of `reviews`" in card


@pytest.mark.slow
def test_prompt_completion_rows_train_an_adapter_that_evaluate_scores_and_push_stages(own_csv: Path) -> None:
    from hf_dpmerge.cli.main import main as hf_dpmerge

    base = save_tiny_llama(own_csv / "tiny-llama", initializer_range=0.5)
    main([*COMPLETION, "--model_name_or_path", str(base), *SMALL_BATCH, "--max_steps", "2", "--lora_r", "2",
          "--max_length", "32", "--lora_layers", "top_1", "--use_cpu", "true", "--disable_tqdm", "true"])
    run = own_csv / "runs_causal" / "qa"
    record = PrivacyRecord.load(run / "adapter")
    assert record.extra["task_kind"] == "prompt_completion" and record.extra["verbalisers"] == []
    assert task_runs(own_csv / "runs_causal")[0].spec.is_generative
    config = yaml.safe_load((Path(__file__).parents[2] / "merge_configs" / "causal_task_arithmetic.yaml").read_text())
    config["models"] = [{"model": "./runs_causal/base+./runs_causal/qa/adapter"}]
    (own_csv / "merge.yaml").write_text(yaml.safe_dump(config))
    assert hf_dpmerge(["merge", "merge.yaml", "merged", "--lora-merge-cache", "runs_causal/lora-cache",
                       "--quiet"]) == 0
    assert hf_dpmerge(["evaluate", "--runs", "runs_causal", "--merged", "merged", "--output", "eval"]) == 0
    row = json.loads((own_csv / "eval" / "results.json").read_text())["tasks"]["qa"]
    trained = json.loads((run / "eval_metrics.json").read_text())["test"]["token_accuracy"]
    assert row["metric"] == "token_accuracy" and row["individual"] == pytest.approx(trained, abs=1e-12)
    assert 0 <= row["floor"] <= 1 and row["num_examples"] == 30
    assert hf_dpmerge(["push", "merged", "--runs", "runs_causal", "--eval_json", "eval/results.json", "--dry-run",
                       "--staging_dir", "staged"]) == 0
    card = (own_csv / "staged" / "README.md").read_text()
    assert "`qa`: a completion of the prompt" in card and "teacher-forced" in card
