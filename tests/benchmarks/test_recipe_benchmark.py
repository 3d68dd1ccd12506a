"""The recipe benchmark's protocol and report, on stored results made up for the test (no training here)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from benchmarks.recipe import grid
from benchmarks.recipe.__main__ import stored
from benchmarks.recipe.report import (
    README,
    README_TABLE_MARKERS,
    choose_recipe,
    holm,
    level_table,
    paired_comparisons,
    render,
    with_readme_table,
)
from benchmarks.recipe.run import UNITS_DIR, load_result, train_arguments, unit_path
from hf_dpmerge.scripts.train import DP_DEFAULTS, parse_arguments
from hf_dpmerge.training.recipe import HEAD_ONLY_RECIPE


def _result(unit: grid.Unit, accuracy: float, seconds: float = 100.0) -> dict:
    return {"unit": unit.__dict__, "argv": train_arguments(unit, Path("<runs>")), "split": unit.split,
            "metrics": {"accuracy": accuracy}, "train_seconds": seconds, "epsilon": unit.epsilon or float("inf"),
            "delta": 1e-5, "steps": 40}


def test_recipes_are_chosen_without_the_report_tasks() -> None:
    assert not set(grid.PROXY_TASKS) & set(grid.REPORT_TASKS)
    assert {u.task for u in grid.select_units()} == set(grid.PROXY_TASKS)
    assert {u.split for u in grid.select_units()} == {"validation"}
    units = grid.report_units(grid.PACKAGED)
    assert {u.task for u in units} == set(grid.REPORT_TASKS) and {u.split for u in units} == {"test"}
    seeds = {(u.recipe, u.epsilon): {v.seed for v in units if (v.recipe, v.epsilon) == (u.recipe, u.epsilon)}
             for u in units}
    assert all(s == set(range(grid.REPORT_SEEDS)) if e in grid.SEEDED_EPSILONS else s == {0}
               for (_, e), s in seeds.items())
    assert len({u.name for u in units}) == len(units)


def test_every_unit_parses_as_the_training_script_would_run_it() -> None:
    for unit in [*grid.select_units(), *grid.report_units(grid.PACKAGED)]:
        script, config = parse_arguments(train_arguments(unit, Path("/tmp/runs")))
        assert script.task == unit.task and config.seed == unit.seed
        assert config.dp == (unit.epsilon is not None)
        if unit.epsilon is not None:
            assert config.target_epsilon == unit.epsilon
        assert script.train_lora == (unit.recipe != grid.FLOOR)
        # the floor runs its own recipe (HEAD_ONLY_RECIPE), as a user's --train_lora false does; LoRA the base recipe
        floor = unit.recipe == grid.FLOOR
        assert config.max_steps == (1000 if floor else 40)
        assert config.per_device_train_batch_size == (1024 if floor else 256)


def test_every_unit_states_every_flag_the_scripts_defaults_set() -> None:
    """A stored unit keeps its meaning when DP_RECIPE (the benchmark's output) changes: its command line sets every
    flag the defaults set."""
    defaults = {flag for flag in [*DP_DEFAULTS, *HEAD_ONLY_RECIPE] if flag.startswith("--")}
    for unit in [*grid.select_units(), *grid.report_units("ffa_head_first")]:
        argv = train_arguments(unit, Path("/tmp/runs"))
        assert defaults - {"--per_device_eval_batch_size", "--seed", "--target_epsilon"} <= set(argv), unit


def test_holm_matches_its_definition_by_brute_force() -> None:
    rng = np.random.default_rng(0)
    for m in (1, 2, 5):
        p = list(rng.uniform(0, 0.2, m))
        order = sorted(range(m), key=lambda i: p[i])
        expected = [0.0] * m
        for rank, i in enumerate(order):
            expected[i] = min(1.0, max((m - j) * p[order[j]] for j in range(rank + 1)))
        assert holm(p) == pytest.approx(expected)


def test_the_chosen_recipe_and_the_paired_test_treat_seeds_as_the_unit(tmp_path: Path) -> None:
    results = {}
    for unit in grid.select_units():
        results[unit.name] = _result(unit, 0.72 if unit.recipe == grid.PACKAGED else 0.7)
    chosen, means = choose_recipe(results)
    assert chosen == grid.PACKAGED and means[grid.PACKAGED] == pytest.approx(0.72)
    assert set(means) == {name for name, recipe in grid.RECIPES.items() if recipe.candidate}
    floor = {0: 0.60, 1: 0.61, 2: 0.59}
    gain = {0: 0.03, 1: 0.05, 2: 0.02}
    for unit in grid.report_units(chosen):
        base = floor[unit.seed] + (gain[unit.seed] if unit.recipe == chosen else 0.0)
        results[unit.name] = _result(unit, base + 0.01 * grid.REPORT_TASKS.index(unit.task))
    rows = {(r["epsilon"], r["other"]): r for r in paired_comparisons(results, chosen)}
    row = rows[(8.0, grid.FLOOR)]
    assert row["seeds"] == [0, 1, 2] and row["diffs"] == pytest.approx([0.03, 0.05, 0.02])
    direct = stats.ttest_rel([floor[s] + gain[s] for s in range(3)], [floor[s] for s in range(3)],
                             alternative="greater").pvalue
    assert row["p"] == pytest.approx(direct)
    assert row["p_holm"] == pytest.approx(min(1.0, 2 * direct))  # two comparisons: ε = 4 and ε = 8, equal p
    text = render(results)
    assert "Chosen: **packaged**" in text and "64 of 64 report units stored" in text
    assert "ε = 8: beat the floor by ≥ 2.0 points, significant — measured +3.33 over 3 seed(s)" in text


def test_stored_results_resume_only_with_the_same_command_line(tmp_path: Path) -> None:
    unit = grid.select_units()[0]
    path = unit_path(unit, tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_result(unit, 0.7)))
    assert load_result(unit, tmp_path) is not None and unit.name in stored(tmp_path)
    stale = {**_result(unit, 0.7), "argv": ["--max_steps", "1"]}
    path.write_text(json.dumps(stale))
    assert load_result(unit, tmp_path) is None and stored(tmp_path) == {}
    assert not list(itertools.islice(tmp_path.rglob("*.tmp"), 1))


def test_the_readme_shows_the_level_table_of_the_stored_units() -> None:
    """The README's defaults section shows the table the defaults came from (rerun --report-only after adding
    units); the block is replaced in place, the text around it kept."""
    start, end = README_TABLE_MARKERS
    readme = README.read_text()
    block = readme.split(start, 1)[1].split(end, 1)[0].strip().splitlines()
    assert block == level_table(stored(UNITS_DIR))
    results = {u.name: _result(u, 0.7) for u in grid.select_units()}
    replaced = with_readme_table(f"before\n{start}\nold\n{end}\nafter\n", results)
    assert replaced == f"before\n{start}\n" + "\n".join(level_table(results)) + f"\n{end}\nafter\n"
    with pytest.raises(ValueError, match="exactly one"):
        with_readme_table("no block here", results)
