"""python -m benchmarks.quality: the smoke grid runs end to end, writes its report, and a rerun skips every unit."""

import json

import pytest

from benchmarks.quality.__main__ import main as quality_benchmark
from tests.utils.subprocess_helpers import run_quality_benchmark
from tests.utils.tiny_models import save_tiny_bert


@pytest.mark.slow
def test_smoke_grid_runs_then_resumes_without_rerunning(tmp_path, capsys):
    base = save_tiny_bert(tmp_path / "tiny-base")
    work = tmp_path / "work"
    command = ["--grid", "smoke", "--work-dir", str(work), "--model_name_or_path", str(base),
               "--trainers", "non_private,dp_merging", "--merges", "ties,dp_aware"]
    first = run_quality_benchmark(*command, cwd=tmp_path)
    assert "ran 8 units, skipped 0" in first.stdout  # 2 cells × (2 trainings + 2 merges)
    stored = sorted((work / "results").rglob("*.json"))
    assert len(stored) == 8
    before = {path: path.stat().st_mtime_ns for path in stored}
    merge = json.loads((work / "results" / "dp_merging-eps4-seed0" / "merge_ties.json").read_text())
    assert set(merge["evaluation"]["tasks"]) == {"rotten_tomatoes", "bbc_news"}
    assert merge["diagnostics"]["bbc_news"]["interpolation"]["gamma"] == [0.0, 0.5, 1.0]
    train = json.loads((work / "results" / "dp_merging-eps4-seed0" / "train_bbc_news.json").read_text())
    assert train["hyperparameters"]["sam_mode"] == "dp_sat" and 0 < train["summary"]["epsilon"] <= 4.0
    assert train["hyperparameters"]["classifier_pooling"] == "mean"  # resolved as the training script's main() does
    record = json.loads((work / "cells" / "dp_merging-eps4-seed0" / "runs" / "bbc_news" / "adapter" /
                         "dp_privacy.json").read_text())
    assert record["extra"]["classifier_pooling"] == "mean"
    assert train["diagnostics"]["drift"] > 0 and train["diagnostics"]["sharpness"] is not None
    assert not (work / "cells" / "dp_merging-eps4-seed0" / "merged" / "ties").exists()  # scored, then removed

    capsys.readouterr()
    assert quality_benchmark(command) == 0  # the rerun, in this process: it only reads and reports
    assert "ran 0 units, skipped 8" in capsys.readouterr().out
    assert {path: path.stat().st_mtime_ns for path in stored} == before
    report = (work / "BENCHMARKS.md").read_text()
    assert "--grid smoke" in report and "## Targets" in report and "not measured in this grid" in report
    assert "| dp_merging | 4 |" in report
    assert (work / "benchmarks" / "plots" / "quality_merged_accuracy.png").stat().st_size > 1000
    assert (work / "benchmarks" / "plots" / "quality_interpolation.png").stat().st_size > 1000
