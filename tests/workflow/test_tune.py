"""hf-dpmerge tune end to end on tiny adapters of real packaged tasks: merge, score on validation, select."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from hf_dpmerge.analysis.evaluation import predict_logits
from hf_dpmerge.analysis.runs_layout import find_tokenizer, load_split, task_runs
from hf_dpmerge.analysis.task_models import load_merged_with_head
from hf_dpmerge.cli.main import main
from hf_dpmerge.data.metrics import compute_metrics, predictions_from_logits
from hf_dpmerge.merging.encoder_adapter import export_encoder_adapter
from hf_dpmerge.scripts.tune import GridAxis, candidate_configs
from tests.utils.merging_builders import lora_config_yaml
from tests.utils.records import privacy_record
from tests.utils.runs_builders import save_fake_adapter
from tests.utils.tiny_models import save_tiny_bert

TASKS = {"bbc_news": 5, "election_tweets": 2}
LAMBDAS = (0.0, 1.0, 2.0)


def _save_adapter(runs: Path, task: str, labels: int, seed: int) -> None:
    """A LoRA adapter with large deltas (predictions move with λ), its record (ε = 4 + seed) and encoder export."""
    save_fake_adapter(runs / "base", runs / task / "adapter", labels, seed)
    privacy_record(task, epsilon=4.0 + seed, extra={"max_length": 32}, seeded=False).save(runs / task / "adapter")
    export_encoder_adapter(runs / task / "adapter", runs / task / "encoder_adapter")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tune")
    save_tiny_bert(root / "runs" / "base")
    for seed, (task, labels) in enumerate(TASKS.items(), start=1):
        _save_adapter(root / "runs", task, labels, seed)
    adapters = [f"./runs/{task}/encoder_adapter" for task in TASKS]
    (root / "ta.yaml").write_text(lora_config_yaml("task_arithmetic", "./runs/base", adapters, "parameters:\n"
                                                   "  lambda: 0.3\n  weight: 1.0\n"))
    return root


def _validation_accuracy(workdir: Path, merged: Path) -> float:
    """Task-averaged validation accuracy computed independently through compute_metrics."""
    scores = []
    for run in task_runs(workdir / "runs", list(TASKS)):
        tokenizer = find_tokenizer([workdir / "runs" / "base"])
        data = load_split(run, "validation", tokenizer)
        logits = predict_logits(load_merged_with_head(merged, run.adapter_dir, run.spec), data, tokenizer)
        predictions = predictions_from_logits(run.spec, logits)
        scores.append(compute_metrics(run.spec, predictions, np.asarray(data["labels"]))["accuracy"])
    return float(np.mean(scores))


def test_grid_parsing_and_candidates() -> None:
    config = {"merge_method": "ties", "models": [{"model": "a"}, {"model": "b", "parameters": {"weight": 1}}]}
    grid = [GridAxis.parse("lambda=0.3,1"), GridAxis.parse("1.weight=0.5,2"), GridAxis.parse("density=0.2")]
    candidates = candidate_configs(config, grid)
    assert [settings for settings, _ in candidates] == [
        {"lambda": 0.3, "models[1].weight": 0.5, "density": 0.2},
        {"lambda": 0.3, "models[1].weight": 2, "density": 0.2},
        {"lambda": 1, "models[1].weight": 0.5, "density": 0.2}, {"lambda": 1, "models[1].weight": 2, "density": 0.2},
    ]
    last = candidates[-1][1]
    assert last["parameters"] == {"lambda": 1, "density": 0.2} and last["models"][1]["parameters"] == {"weight": 2}
    assert config["models"][1]["parameters"] == {"weight": 1}  # the base config is not modified
    for bad in ("lambda", "x.weight=1", "lambda="):
        with pytest.raises(ValueError, match="--grid"):
            GridAxis.parse(bad)
    with pytest.raises(ValueError, match="fewer than 2 candidate"):
        candidate_configs(config, [GridAxis.parse("lambda=0.3")])
    with pytest.raises(ValueError, match="out of range"):
        candidate_configs(config, [GridAxis.parse("2.weight=1,2")])


@pytest.mark.slow
def test_tune_picks_the_best_candidate_at_large_epsilon_and_records_the_total(workdir, monkeypatch, capsys) -> None:
    monkeypatch.chdir(workdir)
    grid = "lambda=" + ",".join(map(str, LAMBDAS))
    assert main(["tune", "ta.yaml", "tuned", "--grid", grid, "--epsilon", "1e6", "--tasks", ",".join(TASKS),
                 "--lora-merge-cache", "cache"]) == 0
    out = capsys.readouterr().out
    record = json.loads((workdir / "tuned" / "dp_selection.json").read_text())
    chosen_lambda = yaml.safe_load((workdir / "tuned" / "mergekit_config.yml").read_text())["parameters"]["lambda"]
    assert record["candidates"][record["chosen"]] == {"lambda": chosen_lambda}
    assert sorted(p.name for p in workdir.iterdir() if "candidates" in p.name) == []  # scratch merges removed

    utilities = {}
    for lam in LAMBDAS:  # the non-private argmax, merged and scored independently
        config = yaml.safe_load((workdir / "ta.yaml").read_text())
        config["parameters"]["lambda"] = lam
        (workdir / f"ta_{lam}.yaml").write_text(yaml.safe_dump(config))
        assert main(["merge", f"ta_{lam}.yaml", f"check_{lam}", "--lora-merge-cache", "cache", "--quiet"]) == 0
        utilities[lam] = _validation_accuracy(workdir, workdir / f"check_{lam}")
    assert len(set(utilities.values())) > 1, utilities  # the grid is informative
    assert utilities[chosen_lambda] == max(utilities.values()), utilities
    assert not any(f"{u:.4f}" in out for u in utilities.values())  # scores are not printed

    sizes = record["validation_sizes"]
    assert record["sensitivity"] == pytest.approx(1 / (2 * min(sizes.values())))
    assert (record["total_epsilon"], record["total_delta"]) == (6.0 + 1e6, 1e-5)  # sequential: max ε_t + ε_sel
    assert record["composition"] == "sequential" and "ε = 1e+06" in out

    assert main(["push", "tuned", "--runs", "runs", "--tasks", ",".join(TASKS), "--dry-run"]) == 0
    card = (workdir / "tuned-hub" / "README.md").read_text()
    assert "chosen on private validation data by the exponential mechanism among 3 candidates" in card
    assert "(ε = 1e+06, δ = 1e-05)-DP" in card
    readme = (workdir / "tuned" / "README.md").read_text()  # its privacy section restated with the total
    assert "(ε = 1e+06, δ = 1e-05)-DP" in readme and "(ε = 6, δ = 1e-05)-DP" not in readme


@pytest.mark.slow
def test_tune_refuses_bad_settings_before_merging(workdir, monkeypatch, capsys) -> None:
    monkeypatch.chdir(workdir)
    common = ["--tasks", ",".join(TASKS), "--lora-merge-cache", "cache"]
    assert main(["tune", "ta.yaml", "bad", "--grid", "lambda=0.3,1", "--epsilon", "0", *common]) == 1
    assert "--epsilon must be positive" in capsys.readouterr().err
    assert main(["tune", "ta.yaml", "bad", "--grid", "lambda=0.3", "--epsilon", "1", *common]) == 1
    assert "fewer than 2 candidate" in capsys.readouterr().err
    (workdir / "occupied").mkdir()
    (workdir / "occupied" / "x").write_text("keep me")
    assert main(["tune", "ta.yaml", "occupied", "--grid", "lambda=0.3,1", "--epsilon", "1", *common]) == 1
    assert (workdir / "occupied" / "x").read_text() == "keep me"
    assert not (workdir / "bad").exists()
