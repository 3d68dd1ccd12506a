"""benchmarks/quality/report.py: the benchmark's targets are judged on the stored numbers, tables show mean ± std."""

import dataclasses

import pytest

from benchmarks.quality.grid import GRIDS, Cell
from benchmarks.quality.report import Results, targets, write_report
from benchmarks.quality.store import Store

TASKS = ("rotten_tomatoes", "bbc_news")
GRID = dataclasses.replace(GRIDS["cpu"], tasks=TASKS, merges=("task_arithmetic", "ties", "cauchy_poe", "dp_aware"))
CURVE = {"gamma": [0.0, 1.0], "loss": [0.5, 0.7], "accuracy": [0.8, 0.7], "merge_gap": 0.2}
# (trainer, ε, seed) → individual accuracy per task, merged accuracy per method
CELLS = {
    ("non_private", None, 0): (0.80, {"task_arithmetic": 0.70, "ties": 0.72, "cauchy_poe": 0.74, "dp_aware": 0.725}),
    ("dp_sgd", 4.0, 0): (0.70, {"task_arithmetic": 0.60, "ties": 0.66, "cauchy_poe": 0.68, "dp_aware": 0.68}),
    ("dp_merging", 4.0, 0): (0.72, {"task_arithmetic": 0.65, "ties": 0.70, "cauchy_poe": 0.72, "dp_aware": 0.72}),
    ("dp_merging", 4.0, 1): (0.74, {"task_arithmetic": 0.65, "ties": 0.72, "cauchy_poe": 0.74, "dp_aware": 0.74}),
    ("dp_sgd", 8.0, 0): (0.70, {"task_arithmetic": 0.62, "ties": 0.64, "cauchy_poe": 0.66, "dp_aware": 0.66}),
    ("dp_merging", 8.0, 0): (0.75, {"task_arithmetic": 0.68, "ties": 0.70, "cauchy_poe": 0.70, "dp_aware": 0.70}),
}


@pytest.fixture
def store(tmp_path) -> tuple[Store, list[Cell]]:
    store, cells = Store(tmp_path), []
    for (trainer, epsilon, seed), (individual, merged) in CELLS.items():
        cell = Cell(trainer, epsilon, seed)
        cells.append(cell)
        host = {"device": "CPU (test)", "cpus": 2}
        for task in TASKS:
            store.save(cell, f"train_{task}", {"unit": f"train_{task}", "task": task}, {
                "summary": {"test": {"accuracy": individual}}, "hyperparameters": {"sam_mode": "x"},
                "diagnostics": {"sharpness": 0.1, "hessian_top_eigenvalue": 2.0, "drift": 0.01},
                "seconds": {"train": 30.0}, "host": host})
        for merge, value in merged.items():
            store.save(cell, f"merge_{merge}", {"unit": f"merge_{merge}"}, {
                "evaluation": {"average": {"individual": individual, "merged": value, "retention": value / individual}},
                "diagnostics": {task: {"merge_gap": 0.2, "interpolation": CURVE} for task in TASKS},
                "seconds": {"merge": 30.0}, "host": host})
    return store, cells


def _settings(cell: Cell, unit: str) -> dict:
    kind, name = unit.split("_", 1)
    return {"unit": unit, "task": name} if kind == "train" else {"unit": unit}


def test_targets_are_judged_on_the_stored_numbers(store):
    lines = targets(Results(store[0], GRID, store[1], _settings))
    text = "\n".join(lines)
    # 1: dp_sgd keeps 70/80 = 88 % (fails), dp_merging 75/80 = 94 % (holds)
    assert lines[0].endswith("**does not hold**")
    assert "dp_sgd, bbc_news: **does not hold** — 70.0 vs 80.0 (88 %)" in text
    assert "dp_merging, bbc_news: **holds** — 75.0 vs 80.0 (94 %)" in text
    # 2: ties at ε = 4: dp_merging (70 + 72) / 2 = 71 vs dp_sgd 66 → +5 points
    assert "2. Merged accuracy at ε = 4 with ties, DP-Merging − DP-SGD ≥ +3 points: **holds**" in text
    assert "(+5.0 points)" in text
    # 3: non-private dp_aware 72.5 vs best baseline 72 (+0.5) fails, cauchy_poe 74 (+2) holds
    assert "non_private, cauchy_poe: **holds**" in text and "non_private, dp_aware: **does not hold**" in text
    # 4: dp_merging ties at ε = 8: 70 vs 72 = 97 %; dp_sgd task_arithmetic 62 vs 70 = 89 %
    assert "dp_merging, ties: **holds** — 70.0 vs 72.0 (97 %)" in text
    assert "dp_sgd, task_arithmetic: **does not hold**" in text


def test_a_missing_comparison_is_not_judged(store):
    cells = [c for c in store[1] if c.trainer != "dp_sgd"]
    text = "\n".join(targets(Results(store[0], GRID, cells, _settings)))
    assert "DP-SGD ≥ +3 points: not measured in this grid" in text


def test_results_made_with_other_settings_do_not_count(store):
    results = Results(store[0], GRID, store[1], lambda cell, unit: {"unit": unit, "task": "changed"})
    assert not results.train and not results.merge
    assert len(results.missing) == len(store[1]) * (len(TASKS) + len(GRID.merges))


def test_report_shows_mean_and_std_over_seeds(store, tmp_path):
    path = write_report(store[0], GRID, store[1], _settings, tmp_path / "report", "python x",
                        ["--max_steps", "60"], {"dp_merging": ["--sam_mode", "dp_sat"]})
    report = path.read_text()
    assert "| dp_merging | 4 | 2 | 73.0 ± 1.4 | 65.0 ± 0.0 | 71.0 ± 1.4 |" in report
    assert "`--max_steps 60`" in report and "CPU (test), 2 CPUs" in report
    assert (tmp_path / "report" / "benchmarks" / "plots" / "quality_interpolation.png").is_file()
