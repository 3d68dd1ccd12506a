"""The domain-weighting study: the target's least-squares slope, one unit per target weight on the runs folder's
adapters, and the report (table, slope, plot) from stored units, written by the harness."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
import yaml

from benchmarks import harness
from benchmarks.harness import Store, Unit
from benchmarks.studies.domain_weighting import DomainWeighting, target_slope
from hf_dpmerge.merging.merge_config import METHOD_PARAMETERS
from hf_dpmerge.records.fingerprint import adapter_fingerprint
from tests.utils.runs_builders import save_scored_runs


def unit(weight: float, target: float, other: float, method: str = "task_arithmetic") -> dict:
    settings = {"method": method, "parameters": METHOD_PARAMETERS[method], "target": "t",
                "adapters": {"t": "sha256:1", "other": "sha256:2"}, "split": "validation", "max_samples": 300,
                "weight": weight}
    tasks = {"t": {"merged": target, "individual": 0.82, "n": 300}, "other": {"merged": other, "individual": 0.95,
                                                                             "n": 178}}
    return {"name": f"{method}-t-w{weight:g}", "settings": settings, "result": {"seconds": 1.0, "tasks": tasks}}


def test_the_slope_and_its_standard_error_by_hand_and_as_numpy_fits_them() -> None:
    # w = 0, 1, 2; a = 80, 81, 83: w̄ = 1, b = (−1·−4/3 + 1·5/3)/2 = 1.5, residuals 1/6, −1/3, 1/6: SE = √(1/6 / 2)
    slope, error = target_slope([unit(0, 0.80, 0.5), unit(1, 0.81, 0.5), unit(2, 0.83, 0.5)], "t")
    assert slope == pytest.approx(1.5) and error == pytest.approx(12 ** -0.5)
    weights, accuracies = [0, 1, 2, 4, 8], [0.900, 0.902, 0.912, 0.920, 0.930]
    slope, error = target_slope([unit(w, a, 0.5) for w, a in zip(weights, accuracies)], "t")
    (fit_slope, _), covariance = np.polyfit(weights, 100 * np.array(accuracies), 1, cov=True)
    assert slope == pytest.approx(fit_slope) and error == pytest.approx(np.sqrt(covariance[0, 0]))


def test_a_flat_curve_has_slope_zero_and_two_weights_are_refused() -> None:
    assert target_slope([unit(w, 0.8, 0.5) for w in (0, 1, 2)], "t") == (0, 0)
    with pytest.raises(ValueError, match="at least three different --weights"):
        target_slope([unit(0, 0.8, 0.5), unit(1, 0.9, 0.5)], "t")


def plan(*argv: str) -> list[Unit]:
    parser = argparse.ArgumentParser()
    DomainWeighting().add_arguments(parser)
    return DomainWeighting().plan(parser.parse_args(list(argv)))


def test_the_plan_is_one_unit_per_weight_on_the_runs_adapters(merge_runs) -> None:
    runs = merge_runs({"rotten_tomatoes": 2, "bbc_news": 5})
    units = plan("--runs", str(runs), "--tasks", "rotten_tomatoes,bbc_news", "--weights", "0,2.5", "--method",
                 "dp_aware")
    assert [u.name for u in units] == ["dp_aware-rotten_tomatoes-w0", "dp_aware-rotten_tomatoes-w2.5"]
    assert units[1].settings == {
        "method": "dp_aware", "parameters": METHOD_PARAMETERS["dp_aware"], "target": "rotten_tomatoes",
        "adapters": {t: adapter_fingerprint(runs / t / "adapter") for t in ("rotten_tomatoes", "bbc_news")},
        "split": "validation", "max_samples": 500, "weight": 2.5}
    for argv, message in ((["--tasks", "bbc_news"], "must hold --target"), (["--weights", "0,a"], "comma-separated"),
                          (["--runs", str(runs.parent / "missing")], "no folder")):
        with pytest.raises(ValueError, match=message):
            plan("--runs", str(runs), "--tasks", "rotten_tomatoes,bbc_news", *argv)


def test_the_report_tables_each_sweep_with_the_slope_and_writes_its_plot(tmp_path: Path) -> None:
    stored = [unit(2, 0.83, 0.88), unit(0, 0.80, 0.90), unit(1, 0.81, 0.90), unit(4, 0.9, 0.9, method="dp_aware")]
    store = Store(tmp_path / "units", DomainWeighting.schema)
    for u in stored:
        store.save(Unit(u["name"], u["settings"]), u["result"])
    assert harness.main(DomainWeighting(), ["--units-dir", str(tmp_path / "units"), "--out", str(tmp_path),
                                            "--report-only"], log=lambda _: None) == 0
    reports = tmp_path / "benchmarks" / "reports" / "domain_weighting"
    second, first = reports.joinpath("DOMAIN_WEIGHTING.md").read_text().split("\n## ")[1:]  # sorted by name
    assert first.splitlines()[2:8] == [
        "| target weight | t | other | others' mean |", "|---|---|---|---|", "| individual | 82.0 | 95.0 |  |",
        "| 0 | 80.0 | 90.0 | 90.0 |", "| 1 | 81.0 | 90.0 | 90.0 |", "| 2 | 83.0 | 88.0 | 88.0 |"]
    assert "t: +1.50 accuracy points per unit of weight (SE 0.29, least squares over 3 weights)." in first
    assert second.startswith("dp_aware, target t, 300 validation examples per task") and "per unit" not in second
    for name in ("task_arithmetic-t", "dp_aware-t"):
        assert f"![{name}]({name}.png)" in first + second
        assert reports.joinpath(f"{name}.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_the_study_merges_the_target_at_each_weight_and_the_others_at_one(tmp_path: Path) -> None:
    runs = save_scored_runs(tmp_path / "runs", {"bbc_news": 5, "election_tweets": 2})
    argv = ["--runs", str(runs), "--tasks", "bbc_news,election_tweets", "--target", "bbc_news", "--weights", "0,1,3",
            "--max_samples", "20", "--units-dir", str(tmp_path / "units"), "--out", str(tmp_path), "--work-dir",
            str(tmp_path / "work")]
    assert harness.main(DomainWeighting(), argv, log=lambda _: None) == 0
    config = yaml.safe_load((tmp_path / "work" / "task_arithmetic-bbc_news-w3.yaml").read_text())
    assert [m["parameters"]["weight"] for m in config["models"]] == [3.0, 1.0]
    stored = Store(tmp_path / "units", DomainWeighting.schema).results()
    assert [u["result"]["tasks"]["bbc_news"]["n"] for u in stored] == [20] * 3
    report = (tmp_path / "benchmarks" / "reports" / "domain_weighting" / "DOMAIN_WEIGHTING.md").read_text()
    assert "least squares over 3 weights" in report and "![task_arithmetic-bbc_news]" in report
