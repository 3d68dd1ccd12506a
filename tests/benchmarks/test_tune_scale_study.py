"""The tune_scale study: the shipped configs' ./runs/ paths moved to the runs folder being tuned, one unit per
(config, λ) naming that folder's adapters by fingerprint, and the report's tables from stored units."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest

from benchmarks import harness
from benchmarks.harness import Store
from benchmarks.studies.tune_scale import CONFIGS, TuneScale, at_runs
from hf_dpmerge.merging.config_edit import read_merge_config, with_parameter
from hf_dpmerge.records.fingerprint import adapter_fingerprint
from tests.utils.runs_builders import save_scored_runs


def plan(*argv: str) -> list:
    parser = argparse.ArgumentParser()
    TuneScale().add_arguments(parser)
    return TuneScale().plan(parser.parse_args(list(argv)))


def test_every_tuned_config_points_at_the_given_runs_and_keeps_its_other_settings(tmp_path: Path) -> None:
    runs = tmp_path / "elsewhere" / "runs"
    for path in CONFIGS:
        config = read_merge_config(path)
        moved = with_parameter(at_runs(config, runs), "lambda", 0.7)
        assert moved["base_model"] == f"{runs}/base"
        for original, entry in zip(config["models"], moved["models"], strict=True):
            base, adapter = entry["model"].split("+")
            assert base == f"{runs}/base"
            assert adapter == original["model"].split("+")[1].replace("./runs/", f"{runs}/")
            assert entry.get("parameters") == original.get("parameters")
        assert moved["parameters"] == {**config["parameters"], "lambda": 0.7}
        assert config["base_model"] == "./runs/base"  # the loaded config is left as it was


def test_the_plan_is_one_unit_per_config_and_lambda_on_the_runs_adapters(merge_runs, tmp_path: Path) -> None:
    runs = merge_runs({"rotten_tomatoes": 2, "bbc_news": 5})
    units = plan("--runs", str(runs), "--configs", str(CONFIGS[0]), str(CONFIGS[-1]), "--grid", "0.2", "1")
    assert [u.name for u in units] == ["task_arithmetic-lambda0.2", "task_arithmetic-lambda1", "dp-lambda0.2",
                                       "dp-lambda1"]
    fingerprints = {t: adapter_fingerprint(runs / t / "adapter") for t in ("bbc_news", "rotten_tomatoes")}
    for unit in units:
        s = unit.settings
        assert s["adapters"] == fingerprints and (s["split"], s["max_eval_samples"]) == ("validation", 500)
        assert s["merge"]["parameters"]["lambda"] == s["lambda"] and s["merge"]["base_model"] == "./runs/base"
    only = plan("--runs", str(runs), "--tasks", "bbc_news")[0].settings["adapters"]
    assert only == {"bbc_news": fingerprints["bbc_news"]}
    store = Store(tmp_path / "units", TuneScale.schema)
    store.save(units[0], {"correct": {}, "n": {}})
    same, other = shutil.copytree(runs, tmp_path / "same"), shutil.copytree(runs, tmp_path / "other")
    record = other / "bbc_news" / "adapter" / "dp_privacy.json"
    record.write_text(record.read_text() + "\n")  # another adapter: its record differs
    assert store.load(plan("--runs", str(same), "--configs", str(CONFIGS[0]), "--grid", "0.2")[0]) is not None
    assert store.load(plan("--runs", str(other), "--configs", str(CONFIGS[0]), "--grid", "0.2")[0]) is None
    with pytest.raises(ValueError, match="no folder"):
        plan("--runs", str(runs), "--tasks", "reuters_r8")


def unit(config: str, lam: float, correct: dict[str, int], fingerprint: str = "sha256:0123456789abcdef") -> dict:
    adapters = {"rotten_tomatoes": fingerprint, "bbc_news": "sha256:fedcba9876543210"}
    return {"name": f"{config}-lambda{lam:g}", "settings": {
        "config": config, "lambda": lam, "merge": {"merge_method": config}, "adapters": adapters,
        "split": "validation", "max_eval_samples": 100}, "result": {"correct": correct,
                                                                    "n": {"rotten_tomatoes": 100, "bbc_news": 50}}}


def test_the_report_tables_mean_validation_accuracy_per_config_and_lambda_and_each_task() -> None:
    stored = [unit("ties", 1, {"rotten_tomatoes": 82, "bbc_news": 46}),
              unit("ties", 0.5, {"rotten_tomatoes": 80, "bbc_news": 45}),
              unit("task_arithmetic", 0.5, {"rotten_tomatoes": 81, "bbc_news": 40}),
              unit("ties", 1, {"rotten_tomatoes": 1, "bbc_news": 1}, fingerprint="sha256:99")]
    text = TuneScale().report(stored)["TUNE_SCALE.md"]
    first, second = text.split("## 2 adapters: ")[1:]
    assert first.startswith("rotten_tomatoes (01234567), bbc_news (fedcba98)") and second.startswith(
        "rotten_tomatoes (99)")  # another runs folder: its own section
    assert "(examples per task: rotten_tomatoes 100, bbc_news 50; never test data)" in first
    assert [line for line in first.splitlines() if line.startswith("|")] == [
        "| config | merge_method | λ = 0.5 | λ = 1 | best λ |", "|---|---|---|---|---|",
        "| task_arithmetic | task_arithmetic | 0.8050 | — | 0.5 |", "| ties | ties | 0.8500 | 0.8700 | 1 |",
        "| config | λ | mean | rotten_tomatoes | bbc_news |", "|---|---|---|---|---|",
        "| task_arithmetic | 0.5 | 0.8050 | 0.810 | 0.800 |", "| ties | 0.5 | 0.8500 | 0.800 | 0.900 |",
        "| ties | 1 | 0.8700 | 0.820 | 0.920 |"]


@pytest.mark.slow
def test_the_study_merges_each_shipped_config_at_each_lambda_and_scores_validation(tmp_path: Path) -> None:
    tasks = {"rotten_tomatoes": 2, "election_tweets": 2, "reuters_r8": 8, "bbc_news": 5}
    runs = save_scored_runs(tmp_path / "runs", tasks)
    argv = ["--runs", str(runs), "--configs", str(CONFIGS[0]), "--grid", "0", "1", "--max_eval_samples", "20",
            "--units-dir", str(tmp_path / "units"), "--out", str(tmp_path), "--work-dir", str(tmp_path / "work")]
    assert harness.main(TuneScale(), argv, log=lambda _: None) == 0
    stored = Store(tmp_path / "units", TuneScale.schema).results()
    assert [u["name"] for u in stored] == ["task_arithmetic-lambda0", "task_arithmetic-lambda1"]
    assert all(u["result"]["n"] == dict.fromkeys(tasks, 20) for u in stored)
    assert not any(path.is_dir() and path.name != "lora_cache" for path in (tmp_path / "work").iterdir())
    report = (tmp_path / "benchmarks" / "reports" / "tune_scale" / "TUNE_SCALE.md").read_text()
    assert "| task_arithmetic | task_arithmetic |" in report
