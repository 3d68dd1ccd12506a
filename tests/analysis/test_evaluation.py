import json
import math
import re
import shutil

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification

from hf_dpmerge.analysis.evaluation import evaluate_runs, predict_logits
from hf_dpmerge.analysis.evaluation_report import CHART_NAME, RESULTS_NAME, EvaluationReport, TaskEvaluation
from hf_dpmerge.analysis.merged_origin import check_merged_from_base
from hf_dpmerge.analysis.task_models import load_individual_model, load_merged_with_head, task_head_state
from hf_dpmerge.analysis.task_run import task_runs
from hf_dpmerge.cli import evaluate_command
from hf_dpmerge.cli.main import main
from hf_dpmerge.data import get_task_spec, load_task, tokenize_task
from hf_dpmerge.records.record import PrivacyRecordError
from tests.utils.merging_builders import lora_config_yaml, save_shared_a_adapter
from tests.utils.runs_builders import MAX_LENGTH, fake_merge_config, runs_record, save_fake_adapter
from tests.utils.tiny_models import save_tiny_bert, save_tiny_llama, tiny_tokenizer


def test_head_swap_reproduces_individual_logits(fake_runs):
    spec = get_task_spec("bbc_news")
    adapter = fake_runs["runs"] / "bbc" / "adapter"
    dsd, _ = load_task("bbc_news", max_eval_samples=25)
    test = tokenize_task(dsd["test"], spec, tiny_tokenizer(), MAX_LENGTH)
    individual = predict_logits(load_individual_model(fake_runs["base"], adapter, spec), test, tiny_tokenizer())
    merged = predict_logits(load_merged_with_head(fake_runs["merged"], adapter, spec), test, tiny_tokenizer())
    assert individual.shape == (25, 5)
    np.testing.assert_allclose(merged, individual, atol=1e-5)
    assert individual.std() > 0.1  # the adapter really changed something: not a trivially equal pair


def test_predict_logits_matches_unbatched_order(fake_runs):
    spec = get_task_spec("election_tweets")
    adapter = fake_runs["runs"] / "election_tweets" / "adapter"
    model = load_individual_model(fake_runs["base"], adapter, spec)
    dsd, _ = load_task("election_tweets", max_eval_samples=9)
    test = tokenize_task(dsd["test"], spec, tiny_tokenizer(), MAX_LENGTH)
    batched = predict_logits(model, test, tiny_tokenizer(), batch_size=4)
    with torch.no_grad():
        one_by_one = [model(input_ids=torch.tensor([row["input_ids"]])).logits[0].numpy() for row in test]
    np.testing.assert_allclose(batched, np.stack(one_by_one), atol=1e-5)


def test_task_head_state_is_the_adapters_trained_head(fake_runs):
    head = task_head_state(fake_runs["runs"] / "bbc" / "adapter")
    assert set(head) == {"classifier.weight", "classifier.bias"}
    assert head["classifier.weight"].shape == (5, 32)


def test_evaluate_runs_scores_retention_and_epsilon(fake_runs, capsys):
    report = evaluate_runs(fake_runs["runs"], fake_runs["merged"], max_eval_samples=30, max_length=MAX_LENGTH,
                           log=lambda line: None)
    bars = capsys.readouterr().err  # progress per task and per batch of each model, on stderr
    assert "tasks: 100%" in bars and all(f"bbc_news {kind}" in bars for kind in ("floor", "individual", "merged"))
    by_task = {t.task: t for t in report.tasks}
    assert set(by_task) == {"bbc_news", "election_tweets"}  # named by the privacy records, not the folders
    bbc, tweets = by_task["bbc_news"], by_task["election_tweets"]
    assert bbc.merged == bbc.individual and bbc.interference == 0.0
    assert bbc.retention == pytest.approx(1.0) or bbc.individual == 0.0
    assert bbc.epsilon == 4.0 and bbc.delta == 1e-5
    assert math.isinf(tweets.epsilon) and tweets.delta is None
    assert bbc.num_examples == tweets.num_examples == 30
    assert bbc.individual_metrics["accuracy"] == bbc.individual and "macro_f1" in bbc.individual_metrics
    avg = report.averages()
    assert avg["individual"] == pytest.approx((bbc.individual + tweets.individual) / 2)
    assert avg["interference"] == pytest.approx((bbc.interference + tweets.interference) / 2)


def test_evaluate_scores_the_floor_beside_the_adapter_and_the_merge(fake_runs, tmp_path):
    """The floor is the unmodified base encoder with the task's own head: scoring a merge at weight 0 (the base's
    weights) as the "merged" model must give exactly the floor; gain retained is (merged − floor)/(individual −
    floor) or below floor."""
    report = evaluate_runs(fake_runs["runs"], fake_runs["merged"], max_eval_samples=30, max_length=MAX_LENGTH,
                           log=lambda line: None)
    at_zero = shutil.copytree(fake_runs["base"], tmp_path / "at_zero")
    (at_zero / "mergekit_config.yml").write_text(fake_merge_config({"bbc": 0.0, "election_tweets": 0.0}))
    on_base = evaluate_runs(fake_runs["runs"], at_zero, ["bbc", "election_tweets"], max_eval_samples=30,
                            max_length=MAX_LENGTH, log=lambda line: None)
    floors = {t.task: t.floor for t in report.tasks}
    assert floors == {t.task: t.merged for t in on_base.tasks} and None not in floors.values()
    for t in report.tasks:
        if t.individual > t.floor:
            assert t.gain_retained == pytest.approx((t.merged - t.floor) / (t.individual - t.floor))
        else:
            assert t.below_floor and math.isnan(t.gain_retained)
    data = report.to_dict()
    assert {row["floor"] for row in data["tasks"].values()} == set(floors.values())
    assert data["average"]["floor"] == pytest.approx(np.mean(list(floors.values())))
    header = report.table().splitlines()[0].split()
    assert header[:5] == ["task", "metric", "ε", "floor", "individual"] and "retention" in header


def test_retention_above_100_percent_is_read_beside_a_floor_and_below_floor_is_named(tmp_path):
    rows = [  # the merge beats its adapter, but the floor alone does as well as either: no gain to retain
        TaskEvaluation("a", "accuracy", 8.0, 1e-5, individual=0.70, merged=0.7238, num_examples=10, floor=0.7218),
        TaskEvaluation("b", "accuracy", 8.0, 1e-5, individual=0.90, merged=0.80, num_examples=10, floor=0.50),
    ]
    report = EvaluationReport(rows, merged_model="m", base_model="b")
    assert rows[0].retention == pytest.approx(1.034, abs=1e-3) and rows[0].below_floor
    assert math.isnan(rows[0].gain_retained) and rows[1].gain_retained == pytest.approx(0.75)
    table = report.table().splitlines()
    assert "below floor" in table[2] and "103.4%" in table[2] and "0.7218" in table[2]
    assert "75.0%" in table[3]
    avg = report.averages()  # on the averaged scores: (0.7619 − 0.6109) / (0.8 − 0.6109)
    assert avg["gain_retained"] == pytest.approx((0.7619 - 0.6109) / (0.80 - 0.6109)) and not avg["below_floor"]
    data = json.loads(report.save(tmp_path)[0].read_text())
    assert data["tasks"]["a"]["gain_retained"] is None and data["tasks"]["a"]["below_floor"] is True
    assert data["tasks"]["b"]["gain_retained"] == pytest.approx(0.75)
    again = EvaluationReport.from_dict(data)
    assert [t.floor for t in again.tasks] == [0.7218, 0.50]


def test_report_definitions_and_json_roundtrip(tmp_path):
    rows = [
        TaskEvaluation("a", "accuracy", 8.0, 1e-5, individual=0.8, merged=0.6, num_examples=10),
        TaskEvaluation("b", "matthews_correlation", math.inf, None, individual=0.0, merged=-0.1, num_examples=10),
    ]
    report = EvaluationReport(rows, merged_model="m", base_model="b")
    assert rows[0].retention == pytest.approx(0.75) and rows[0].interference == pytest.approx(0.2)
    assert math.isnan(rows[1].retention)  # undefined, not a division by zero
    avg = report.averages()
    assert avg["retention"] == pytest.approx(0.75)  # undefined retentions are left out of the mean
    assert avg["merged"] == pytest.approx(0.25) and avg["interference"] == pytest.approx(0.15)
    json_path, chart = report.save(tmp_path)
    data = json.loads(json_path.read_text())
    assert data["tasks"]["a"]["retention"] == pytest.approx(0.75) and data["tasks"]["b"]["retention"] is None
    assert math.isinf(data["tasks"]["b"]["epsilon"]) and data["max_epsilon"] == math.inf
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "∞" in report.table() and "75.0%" in report.table()


def test_cli_writes_results_and_chart(fake_runs, tmp_path, capsys):
    parser = __import__("argparse").ArgumentParser()
    evaluate_command.add_arguments(parser)
    out = tmp_path / "eval"
    args = parser.parse_args(["--runs", str(fake_runs["runs"]), "--merged", str(fake_runs["merged"]), "--tasks", "bbc",
                              "--output", str(out), "--max_eval_samples", "20"])
    assert evaluate_command.run(args) == 0
    data = json.loads((out / RESULTS_NAME).read_text())
    assert list(data["tasks"]) == ["bbc_news"] and data["tasks"]["bbc_news"]["num_examples"] == 20
    assert (out / CHART_NAME).stat().st_size > 1000
    assert "bbc_news" in capsys.readouterr().out


def test_validation_split_is_scored_when_asked(fake_runs):
    report = evaluate_runs(fake_runs["runs"], fake_runs["merged"], ["bbc"], max_length=MAX_LENGTH, split="validation",
                           log=lambda line: None)
    assert report.tasks[0].num_examples == 178  # bbc_news: 10 % of train (its test split has 445)
    assert report.to_dict()["split"] == "validation"


def test_clear_errors_for_missing_dirs_and_records(fake_runs, tmp_path):
    with pytest.raises(FileNotFoundError, match="mergekit-yaml"):
        evaluate_runs(fake_runs["runs"], tmp_path / "nowhere", log=lambda line: None)
    with pytest.raises(FileNotFoundError, match="--tasks missing_task: no folder"):
        evaluate_runs(fake_runs["runs"], fake_runs["merged"], ["missing_task"], log=lambda line: None)
    (fake_runs["runs"] / "empty_task").mkdir(exist_ok=True)
    with pytest.raises(FileNotFoundError, match="not a peft adapter"):
        evaluate_runs(fake_runs["runs"], fake_runs["merged"], ["empty_task"], log=lambda line: None)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        evaluate_runs(tmp_path / "no_runs", fake_runs["merged"], base_dir=fake_runs["base"], log=lambda line: None)
    bare = tmp_path / "runs" / "bare" / "adapter"
    bare.mkdir(parents=True)
    for f in (fake_runs["runs"] / "bbc" / "adapter").iterdir():
        if f.name != "dp_privacy.json":
            (bare / f.name).write_bytes(f.read_bytes())
    with pytest.raises(PrivacyRecordError, match="no privacy record"):
        evaluate_runs(tmp_path / "runs", fake_runs["merged"], ["bare"], base_dir=fake_runs["base"],
                      log=lambda line: None)


def test_head_of_the_wrong_size_is_refused(fake_runs):
    spec = get_task_spec("reuters_r8")  # 8 labels; the bbc adapter's head has 5
    with pytest.raises(ValueError, match="head shapes differ"):
        load_merged_with_head(fake_runs["merged"], fake_runs["runs"] / "bbc" / "adapter", spec)


def test_same_shape_head_is_replaced_not_kept(fake_runs):
    adapter = fake_runs["runs"] / "election_tweets" / "adapter"  # 2 labels, like the merged model's own head
    model = load_merged_with_head(fake_runs["merged"], adapter, get_task_spec("election_tweets"))
    head = task_head_state(adapter)
    assert torch.equal(model.classifier.weight, head["classifier.weight"])
    assert torch.equal(model.classifier.bias, head["classifier.bias"])
    assert model.config.id2label == {0: "HillaryClinton", 1: "realDonaldTrump"}


def test_default_tasks_are_the_ones_the_merged_model_merged(fake_runs, tmp_path):
    import shutil

    from hf_dpmerge.analysis.task_run import task_runs

    merged = tmp_path / "merged"
    shutil.copytree(fake_runs["merged"], merged)
    (merged / "mergekit_config.yml").unlink()
    assert [r.name for r in task_runs(fake_runs["runs"], merged_dir=merged)] == ["bbc", "election_tweets"]  # no config
    (merged / "mergekit_config.yml").write_text(
        "merge_method: dp_aware\nbase_model: runs/base\nmodels:\n  - model: runs/base+runs/bbc/encoder_adapter\n"
    )
    assert [r.name for r in task_runs(fake_runs["runs"], merged_dir=merged)] == ["bbc"]  # election_tweets never merged
    assert [r.name for r in task_runs(fake_runs["runs"], ["election_tweets"], merged_dir=merged)] == ["election_tweets"]
    (merged / "mergekit_config.yml").write_text("merge_method: ties\nmodels:\n  - model: elsewhere/x\n")
    with pytest.raises(ValueError, match="merges none of the run folders.*pass --runs or --tasks"):
        task_runs(fake_runs["runs"], merged_dir=merged)


def test_evaluate_numbers_equal_the_merge_retention_module_on_the_same_predictions(fake_runs, tmp_path, monkeypatch):
    """`hf-dpmerge evaluate` and a user's ``evaluate.load(<merge_retention>)`` agree on the same predictions,
    and the command's retention/interference are that module's kernel (one implementation)."""
    import argparse

    import evaluate

    from hf_dpmerge.analysis.task_run import load_split, task_runs
    from hf_dpmerge.data.metrics import load_metric, metric_path, predictions_from_logits

    parser = argparse.ArgumentParser()
    evaluate_command.add_arguments(parser)
    out = tmp_path / "eval"
    arguments = ["--runs", str(fake_runs["runs"]), "--merged", str(fake_runs["merged"]), "--output", str(out),
                 "--max_eval_samples", "30"]
    assert evaluate_command.run(parser.parse_args(arguments)) == 0
    rows = json.loads((out / RESULTS_NAME).read_text())["tasks"]
    assert set(rows) == {"bbc_news", "election_tweets"}
    for run in task_runs(fake_runs["runs"], max_length=MAX_LENGTH, merged_dir=fake_runs["merged"]):
        examples = load_split(run, "test", tiny_tokenizer(), max_samples=30)
        predictions = {
            kind: predictions_from_logits(run.spec, predict_logits(loader(directory, run.adapter_dir, run.spec),
                                                                   examples, tiny_tokenizer()))
            for kind, loader, directory in (("individual", load_individual_model, fake_runs["base"]),
                                            ("merged", load_merged_with_head, fake_runs["merged"]))
        }
        user = evaluate.load(str(metric_path("merge_retention")), run.spec.metric).compute(
            individual_predictions=predictions["individual"].tolist(),
            merged_predictions=predictions["merged"].tolist(), references=list(examples["labels"]))
        row = rows[run.spec.name]
        for key in ("individual", "merged", "interference"):
            assert row[key] == pytest.approx(user[key], abs=1e-12), (run.spec.name, key)
        assert row["retention"] == (None if math.isnan(user["retention"]) else pytest.approx(user["retention"]))

    kernel = type(load_metric("merge_retention"))
    monkeypatch.setattr(kernel, "from_scores", staticmethod(lambda i, m: {"retention": 0.25, "interference": -1.0}))
    row = TaskEvaluation("a", "accuracy", 8.0, 1e-5, individual=0.8, merged=0.6, num_examples=10)
    assert (row.retention, row.interference) == (0.25, -1.0)  # the command's numbers are the module's kernel


def test_a_missing_task_folder_is_named(fake_runs):
    from hf_dpmerge.analysis.task_run import task_runs

    message = r"--tasks election-tweets: no folder .*election-tweets \(did you mean 'election_tweets'\?\)"
    with pytest.raises(FileNotFoundError, match=message):
        task_runs(fake_runs["runs"], ["election-tweets"])


def test_evaluate_refuses_a_merged_model_of_another_architecture(fake_runs, tmp_path, monkeypatch, capsys):
    """The quick start's default merged/ (a BERT merge) is not the causal runs' merged model: one line naming both,
    before any model is scored (it used to die with an IndexError in an embedding)."""
    root = fake_runs["merged"].parent
    save_tiny_llama(root / "runs_causal" / "base")
    save_shared_a_adapter(root / "runs_causal", "rotten_tomatoes", 2, seed=1, causal=True)
    monkeypatch.chdir(root)
    capsys.readouterr()
    assert main(["evaluate", "--runs", "runs_causal", "--max_eval_samples", "4"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
    assert errors == ["hf-dpmerge evaluate: error: merged model merged is a bert (BertForSequenceClassification) "
                      "but the runs' base runs_causal/base is a llama (LlamaForCausalLM): it was not merged from "
                      "these runs' base; pass --merged with the merge of these runs"]
    assert not (root / "runs_causal" / "eval").exists()


def test_a_merged_model_of_another_base_is_refused_naming_the_tensor(merge_runs, tmp_path):
    """Same architecture, another base: a tensor no adapter changes differs; the merge of the runs' own base
    (which changes only the LoRA-covered weights) passes."""
    runs = merge_runs({"rotten_tomatoes": 2, "bbc_news": 5})
    base = runs / "base"
    merged = AutoModelForSequenceClassification.from_pretrained(base)
    with torch.no_grad():
        merged.bert.encoder.layer[0].attention.self.query.weight.add_(0.1)  # covered by the records: merged
    merged.save_pretrained(tmp_path / "merged", safe_serialization=True)
    check_merged_from_base(base, tmp_path / "merged", task_runs(runs))
    other = save_tiny_bert(tmp_path / "other", seed=1)
    with pytest.raises(ValueError, match=r"merged model .*other was not merged from the runs' base .*base: "
                                         r"bert\.embeddings\..*, which no adapter changes, has base fingerprint"):
        check_merged_from_base(base, other, task_runs(runs))


def test_evaluate_refuses_what_is_no_merge_of_the_runs_and_writes_nothing(fake_runs, tmp_path, capsys):
    """The runs' base itself, a model without mergekit_config.yml, and merges of none or not each of the runs scored
    are refused in one line before any model is scored: the previous results.json and retention.png stay."""
    runs = fake_runs["runs"]
    output = tmp_path / "eval"
    output.mkdir()
    previous = {RESULTS_NAME: b'{"previous": true}', CHART_NAME: b"previous chart"}
    for name, content in previous.items():
        (output / name).write_bytes(content)
    no_config = shutil.copytree(fake_runs["merged"], tmp_path / "no_config")
    (no_config / "mergekit_config.yml").unlink()
    elsewhere = shutil.copytree(fake_runs["merged"], tmp_path / "elsewhere")
    (elsewhere / "mergekit_config.yml").write_text("merge_method: linear\nmodels:\n  - model: elsewhere/x\n")
    bbc_only = shutil.copytree(fake_runs["merged"], tmp_path / "bbc_only")
    (bbc_only / "mergekit_config.yml").write_text(fake_merge_config({"bbc": 1.0}))
    cases = [
        ([str(runs / "base")], "--merged .*/runs/base is the runs' base .*/runs/base itself, not a merge of the runs"),
        ([str(runs / ".." / "runs" / "base"), "--tasks", "bbc"], "is the runs' base .* itself"),
        ([str(no_config)], "merged model .*no_config is no merge output: it has no mergekit_config.yml"),
        ([str(elsewhere)], "mergekit_config.yml merges none of the run folders under"),
        ([str(bbc_only), "--tasks", "bbc,election_tweets"], "bbc_only does not merge election_tweets .*merges bbc"),
    ]
    for merged, message in cases:
        assert main(["evaluate", "--runs", str(runs), "--merged", *merged, "--output", str(output)]) == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
        assert len(errors) == 1 and re.search(f"^hf-dpmerge evaluate: error: .*{message}", errors[0]), errors
    assert {p.name: p.read_bytes() for p in output.iterdir()} == previous


def test_evaluate_refuses_runs_trained_on_another_base_than_the_merges(merge_runs, tmp_path, capsys):
    """A merge whose mergekit_config.yml names another base (as a stock method merged it before hf-dpmerge merge
    checked bases): each run's record fingerprints its own base, so the task is named before anything is scored."""
    runs = merge_runs({"rotten_tomatoes": 2, "bbc_news": 5})
    other = save_tiny_bert(tmp_path / "other", seed=1)
    merged = shutil.copytree(other, tmp_path / "merged")
    adapters = [str(runs / task / "encoder_adapter") for task in ("rotten_tomatoes", "bbc_news")]
    (merged / "mergekit_config.yml").write_text(lora_config_yaml("task_arithmetic", str(other), adapters))
    output = tmp_path / "eval"
    assert main(["evaluate", "--runs", str(runs), "--merged", str(merged), "--output", str(output)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and re.search(
        r"error: task 'rotten_tomatoes' was trained on another base model: its privacy record's base_model_hash "
        rf"sha256:\w+ does not match the merge's base {re.escape(str(other))} sha256:\w+; pass --merged with the "
        "merge of these runs$", errors[0]), errors
    assert not output.exists()


def test_a_reused_report_scores_only_the_merged_model_and_gives_the_full_evaluations_numbers(fake_runs, tmp_path,
                                                                                           monkeypatch):
    """reuse=: a second merge of the same runs, evaluated with the first one's report, runs one model per task (the
    merge) and equals its evaluation from scratch; a report of another split is refused."""
    from hf_dpmerge.analysis import evaluation

    settings = dict(max_eval_samples=30, max_length=MAX_LENGTH, log=lambda line: None, progress=False)
    first = evaluate_runs(fake_runs["runs"], fake_runs["merged"], **settings)
    at_zero = shutil.copytree(fake_runs["base"], tmp_path / "at_zero")
    (at_zero / "mergekit_config.yml").write_text(fake_merge_config({"bbc": 0.0, "election_tweets": 0.0}))
    scratch = evaluate_runs(fake_runs["runs"], at_zero, **settings)
    calls = []
    monkeypatch.setattr(evaluation, "predict_logits", lambda *a, **k: calls.append(a) or predict_logits(*a, **k))
    reused = evaluate_runs(fake_runs["runs"], at_zero, reuse=EvaluationReport.from_dict(first.to_dict()), **settings)
    assert len(calls) == len(first.tasks) == 2
    assert reused.to_dict() == scratch.to_dict()
    with pytest.raises(ValueError, match="reuse: the report scored .*'test'.*not .*'validation'"):
        evaluate_runs(fake_runs["runs"], at_zero, reuse=first, split="validation", **settings)


def test_the_floor_is_the_private_head_when_floor_runs_are_given(fake_runs, tmp_path):
    """--floor_runs: the floor is the head-only release's score (its own base + its trained head), the adapter's
    own head on the base encoder moves to 'own head'; a floor at another ε is refused naming the flag."""
    floor_runs = tmp_path / "runs_floor"
    shutil.copytree(fake_runs["base"], floor_runs / "base")
    save_fake_adapter(floor_runs / "base", floor_runs / "bbc" / "adapter", num_labels=5, seed=3)
    runs_record("bbc_news", epsilon=4.0, max_length=MAX_LENGTH, train_lora=False).save(floor_runs / "bbc" / "adapter")
    settings = dict(max_eval_samples=30, max_length=MAX_LENGTH, log=lambda line: None, progress=False)
    (plain,) = evaluate_runs(fake_runs["runs"], fake_runs["merged"], ["bbc"], **settings).tasks
    report = evaluate_runs(fake_runs["runs"], fake_runs["merged"], ["bbc"], floor_runs=floor_runs, **settings)
    (head_only,) = evaluate_runs(floor_runs, fake_runs["merged"], ["bbc"], base_dir=floor_runs / "base",
                                 **settings).tasks
    (task,) = report.tasks
    assert task.floor == head_only.individual and task.own_head == plain.floor
    assert (task.individual, task.merged) == (plain.individual, plain.merged)
    assert report.floor_kind == "private_head" and "\nfloor: the private head: " in report.table()
    assert "own head" in report.table().splitlines()[0]
    assert EvaluationReport.from_dict(report.to_dict()).tasks[0].own_head == task.own_head
    runs_record("bbc_news", epsilon=8.0, max_length=MAX_LENGTH, train_lora=False).save(floor_runs / "bbc" / "adapter")
    with pytest.raises(ValueError, match="--floor_runs .*bbc's private head cannot be its floor: its ε = 8"):
        evaluate_runs(fake_runs["runs"], fake_runs["merged"], ["bbc"], floor_runs=floor_runs, **settings)


def test_a_causal_task_scored_without_the_answers_end_is_marked_in_the_table_and_results():
    from hf_dpmerge.analysis.causal_evaluation import CausalEvaluationReport, CausalTaskEvaluation

    tasks = [CausalTaskEvaluation("bbc_news", "accuracy", 8.0, 0.2, 0.6, 0.5, 445, answer_end_scored=False),
             CausalTaskEvaluation("election_tweets", "accuracy", 8.0, 0.5, 0.6, 0.55, 500)]
    report = CausalEvaluationReport(tasks, merged_model="merged", base_model="base")
    lines = report.table().splitlines()
    assert lines[2].startswith("bbc_news †") and lines[3].startswith("election_tweets ")
    assert lines[-1].startswith("† scored on the verbaliser's tokens alone")
    rows = report.to_dict()["tasks"]
    assert rows["bbc_news"]["answer_end_scored"] is False and rows["election_tweets"]["answer_end_scored"] is True
    assert rows["bbc_news"]["gain_retained"] == pytest.approx(0.75)


def test_a_record_written_before_the_answer_end_option_learnt_the_end():
    assert runs_record("bbc_news").answer_end_trained is True
    assert runs_record("bbc_news", train_answer_end=False).answer_end_trained is False


def test_the_tokenizer_of_a_release_with_remote_code_loads_without_asking_to_run_it(tmp_path, monkeypatch):
    """An adapter folder that is a stock release (mean pooling: ``auto_map`` and the remote model code beside its
    config) gives its stock tokenizer, and transformers never prompts to run the folder's code."""
    from hf_dpmerge.analysis.task_run import find_tokenizer
    from hf_dpmerge.modeling.stock_release import REMOTE_MODEL_TYPE, save_stock_classifier
    from tests.utils.tiny_models import tiny_bert

    model = tiny_bert(num_labels=2)
    model.config.classifier_pooling = "mean"
    save_stock_classifier(model, tmp_path, ["neg", "pos"])
    tiny_tokenizer().save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == REMOTE_MODEL_TYPE
    asked = []
    monkeypatch.setattr("builtins.input", lambda *args: asked.append(args) or "n")
    tokenizer = find_tokenizer([tmp_path])
    assert not asked
    assert tokenizer("the film")["input_ids"] == tiny_tokenizer()("the film")["input_ids"]
