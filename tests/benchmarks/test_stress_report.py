"""BENCHMARKS_STRESS.md from stored stress results: targets judged on paired tests, gain retained, selections."""

import json

import numpy as np
import pytest

from benchmarks.quality.grid import GRIDS, plan_cells
from benchmarks.quality.merge_space import SPACES
from benchmarks.quality.scoring import encode
from benchmarks.quality.store import Store
from benchmarks.quality.stress_report import EVIDENCE_NAME, write_stress_report

N = 200  # test examples per task


def _correct(rate: float) -> np.ndarray:
    """The first ``rate·N`` examples right: a better model's right answers contain a worse one's (paired)."""
    return (np.arange(N) < round(rate * N)).astype(np.int8)


def _store(tmp_path, merged_rate, test_ids=None, selected=1):
    grid = GRIDS["stress-smoke"]
    cells = plan_cells(grid, grid.seeds)
    store = Store(tmp_path)
    settings = {"fixed": True}
    for cell in cells:
        individual = 0.9 if cell.trainer != "head_only" else 0.5
        tests = {t: _correct(individual) for t in grid.tasks}
        store.save(cell, "individual", settings, {
            "accuracy": {split: {t: individual for t in grid.tasks} for split in ("validation", "test")},
            "correct": {"validation": encode(tests), "test": encode(tests)}, "seconds": {"scoring": 1.0},
            **({"examples": {"test": {t: test_ids(cell.seed) for t in grid.tasks}}} if test_ids else {})})
        for task in grid.tasks:
            store.save(cell, f"{'noise' if cell.noise_std else 'train'}_{task}", settings, {"seconds": {"train": 1.0}})
        if not cell.merged:
            continue
        for method in grid.merges:
            rate = merged_rate(cell, method)
            point = SPACES[method][selected]
            store.save(cell, f"tune_{method}", settings, {
                "trials": [{"point": p, "validation": {}, "mean": rate if p == point else rate - 0.1}
                           for p in SPACES[method]],
                "selected": selected, "point": point, "test": {t: rate for t in grid.tasks},
                "correct": encode({t: _correct(rate) for t in grid.tasks}), "seconds": {"merge": 1.0}})
    return grid, cells, store, settings


def test_report_judges_the_targets_on_paired_tests_and_shows_gain_and_choices(tmp_path):
    def merged_rate(cell, method):
        if cell.trainer == "dp_merging" and method == "ties":
            return 0.85  # +5 points over dp_sgd's ties on every example pair: target 1 holds
        return 0.8

    grid, cells, store, settings = _store(tmp_path, merged_rate)
    path = write_stress_report(store, grid, cells, lambda cell, unit: settings, tmp_path, "cmd", ["--x"], {})
    report = path.read_text()
    assert "1. TIES at ε = 4, DP-Merging − DP-SGD ≥ +3 points, significant: **holds** — +5.0 points" in report
    assert "2. Better of cauchy_poe / dp_aware" in report and "**does not hold**" in report
    # gain retained = (80 − 50)/(90 − 50) = 75 % for every merge but dp_merging's ties: (85 − 50)/40 = 87.5 %
    assert "| non_private | 75.0 ± 0.0 | 75.0 ± 0.0 |" in report
    assert "| dp_merging ε=4 | 87.5 ± 0.0 | 75.0 ± 0.0 |" in report
    assert "| non_private | lambda=1 / lambda=1 | lambda=0.5 / lambda=0.5 |" in report  # chosen points, per seed
    assert "no choice is." in report and "(edge)** /" not in report and "(edge)** |" not in report
    assert "| ε = 4 | 2 | 5.0 | dp_merging | ties | 85.0 ± 0.0 | vs dp_aware: +5.0 (significant) |" in report
    assert "Incomplete" not in report
    # seeds are the unit, the stress-smoke seeds share one subset: 2 tasks × 200 distinct examples, not × 2 seeds
    assert "paired t on seed means p = 0, Holm-adjusted over 5 comparisons p = 0; 2 seeds, 400 distinct test " \
           "examples; significant)" in report
    assert "4500" not in report and "800 distinct" not in report


def test_report_counts_the_union_of_per_seed_test_subsets(tmp_path):
    grid, cells, store, settings = _store(tmp_path, lambda cell, method: 0.8,
                                          test_ids=lambda seed: list(range(100 * seed, 100 * seed + N)))
    report = write_stress_report(store, grid, cells, lambda cell, unit: settings, tmp_path, "cmd", [], {}).read_text()
    assert "2 seeds, 600 distinct test examples" in report  # per task: seed 0 has 0–199, seed 1 has 100–299


def test_report_says_a_target_does_not_hold_when_the_difference_is_not_significant(tmp_path):
    grid, cells, store, settings = _store(tmp_path, lambda cell, method: 0.8)
    report = write_stress_report(store, grid, cells, lambda cell, unit: settings, tmp_path, "cmd", [], {}).read_text()
    assert "significant: **does not hold** — +0.0 points" in report


def test_a_floor_that_beats_every_merge_is_the_recommendation_and_gain_is_undefined_below_it(tmp_path):
    grid, cells, store, settings = _store(tmp_path, lambda cell, method: 0.8)
    for cell in cells:  # the private adapters (0.7) fall below their floors (0.95); the non-private ones do not
        if cell.epsilon is None or cell.noise_std is not None:
            continue
        rate = 0.95 if cell.trainer == "head_only" else 0.7
        tests = {t: _correct(rate) for t in grid.tasks}
        store.save(cell, "individual", settings, {
            "accuracy": {split: {t: rate for t in grid.tasks} for split in ("validation", "test")},
            "correct": {"validation": encode(tests), "test": encode(tests)}, "seconds": {"scoring": 1.0}})
    report = write_stress_report(store, grid, cells, lambda cell, unit: settings, tmp_path, "cmd", [], {}).read_text()
    assert "| dp_sgd ε=4 | below floor | below floor |" in report
    assert "| non_private | 75.0 ± 0.0 | 75.0 ± 0.0 |" in report  # (80 − 50)/(90 − 50)
    floor_row = ("| ε = 4 | 2 | 0 (no merge) | head_only (LoRA frozen) | none: base encoder + each task's head | "
                 "95.0 | vs ")  # one floor seed
    assert floor_row in report and "+15.0 (significant) |" in report
    assert "| non-private | 2 | 10.0 | non_private |" in report  # its floor (50) does not beat the merges (80)


def test_a_choice_at_the_end_of_its_grid_is_flagged(tmp_path):
    grid, cells, store, settings = _store(tmp_path, lambda cell, method: 0.8, selected=0)
    report = write_stress_report(store, grid, cells, lambda cell, unit: settings, tmp_path, "cmd", [], {}).read_text()
    assert "| non_private | lambda=0.5 **(edge)** / lambda=0.5 **(edge)** | lambda=0.25 **(edge)** / " in report
    assert "14 of 14 choices are at an edge (dp_aware, ties)." in report  # 3 groups × 2 seeds + noise, × 2


def test_the_report_writes_the_rows_recommend_reads_in_its_schema(tmp_path):
    from hf_dpmerge.merging.planning.merge_recommendation import EVIDENCE

    grid, cells, store, settings = _store(tmp_path, lambda cell, method: 0.85 if method == "ties" else 0.8)
    write_stress_report(store, grid, cells, lambda cell, unit: settings, tmp_path, "cmd", [], {})
    rows = json.loads((tmp_path / EVIDENCE_NAME).read_text())["settings"]
    assert all(set(row) == set(EVIDENCE["settings"][0]) for row in rows)
    non_private = next(row for row in rows if row["epsilon"] is None and row["noise_std"] is None)
    assert non_private["merge"] == "ties" and non_private["point"] == SPACES["ties"][1]
    assert non_private["accuracy"] == 85.0 and non_private["versus"] == "dp_aware"
    assert non_private["difference"] == pytest.approx(5.0) and non_private["significant"] is True
    assert "Holm-adjusted" in non_private["test"] and non_private["seeds"] == 2
