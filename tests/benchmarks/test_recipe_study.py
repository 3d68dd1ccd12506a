"""The recipe benchmark's protocol and report, on stored results made up for the test (no training here), and the
docs/benchmarks.md table it exports."""

from __future__ import annotations

import argparse

import pytest
from scipy import stats

from benchmarks import harness
from benchmarks.harness import Unit
from benchmarks.studies import recipe
from hf_dpmerge.scripts.train import DP_DEFAULTS, parse_arguments
from hf_dpmerge.training.recipe import HEAD_ONLY_RECIPE


def _stored(unit: Unit, accuracy: float, seconds: float = 100.0) -> dict:
    split = "validation" if unit.settings["stage"] == "select" else "test"
    return {"name": unit.name, "settings": unit.settings,
            "result": {split: {"accuracy": accuracy}, "train_seconds": seconds, "steps": 40}}


def _parse(unit: Unit):
    return parse_arguments([*unit.settings["flags"], "--task", unit.settings["task"], "--seed",
                            str(unit.settings["seed"])])


def test_recipes_are_chosen_without_the_report_tasks() -> None:
    assert not set(recipe.PROXY_TASKS) & set(recipe.REPORT_TASKS)
    assert {u.settings["task"] for u in recipe.select_units()} == set(recipe.PROXY_TASKS)
    units = recipe.report_units(recipe.PACKAGED)
    assert {u.settings["task"] for u in units} == set(recipe.REPORT_TASKS)
    seeds = {}
    for u in units:
        seeds.setdefault((u.settings["recipe"], u.settings["epsilon"]), set()).add(u.settings["seed"])
    assert all(s == set(range(recipe.REPORT_SEEDS)) if e in recipe.SEEDED_EPSILONS else s == {0}
               for (_, e), s in seeds.items())
    assert len({u.name for u in units}) == len(units)


def test_every_unit_parses_as_the_training_script_would_run_it() -> None:
    for unit in [*recipe.select_units(), *recipe.report_units(recipe.PACKAGED)]:
        s = unit.settings
        script, config = _parse(unit)
        assert script.task == s["task"] and config.seed == s["seed"] and config.dp == (s["epsilon"] is not None)
        if s["epsilon"] is not None:
            assert config.target_epsilon == s["epsilon"]
        assert script.train_lora == (s["recipe"] != recipe.FLOOR)
        # the floor runs its own recipe (HEAD_ONLY_RECIPE), as a user's --train_lora false does; LoRA the base recipe
        floor = s["recipe"] == recipe.FLOOR
        assert config.max_steps == (1000 if floor else 40)
        assert config.per_device_train_batch_size == (1024 if floor else 256)


def test_every_unit_states_every_flag_the_scripts_defaults_set() -> None:
    """A stored unit keeps its meaning when DP_RECIPE (the benchmark's output) changes: its settings set every flag
    the defaults set."""
    defaults = {flag for flag in [*DP_DEFAULTS, *HEAD_ONLY_RECIPE] if flag.startswith("--")}
    for unit in [*recipe.select_units(), *recipe.report_units("ffa_head_first")]:
        assert defaults - {"--per_device_eval_batch_size", "--seed", "--target_epsilon"} <= set(
            unit.settings["flags"]), unit.name


def test_the_report_stage_is_planned_once_the_select_stage_is_stored(tmp_path) -> None:
    store = harness.Store(tmp_path, recipe.RecipeStudy.schema)
    args = argparse.Namespace(units_dir=tmp_path)
    assert recipe.RecipeStudy().plan(args) == recipe.select_units()
    for unit in recipe.select_units():
        store.save(unit, _stored(unit, 0.72 if unit.settings["recipe"] == "ffa" else 0.7)["result"])
    assert recipe.RecipeStudy().plan(args) == recipe.select_units() + recipe.report_units("ffa")


def test_the_chosen_recipe_and_the_paired_test_treat_seeds_as_the_unit() -> None:
    stored = [_stored(u, 0.72 if u.settings["recipe"] == recipe.PACKAGED else 0.7) for u in recipe.select_units()]
    chosen, means = recipe.choose_recipe(recipe.by_name(stored))
    assert chosen == recipe.PACKAGED and means[recipe.PACKAGED] == pytest.approx(0.72)
    assert set(means) == {name for name, spec in recipe.RECIPES.items() if spec.candidate}
    floor = {0: 0.60, 1: 0.61, 2: 0.59}
    gain = {0: 0.03, 1: 0.05, 2: 0.02}
    for unit in recipe.report_units(chosen):
        s = unit.settings
        base = floor[s["seed"]] + (gain[s["seed"]] if s["recipe"] == chosen else 0.0)
        stored.append(_stored(unit, base + 0.01 * recipe.REPORT_TASKS.index(s["task"])))
    results = recipe.by_name(stored)
    rows = {(r["epsilon"], r["other"]): r for r in recipe.paired_comparisons(results, chosen)}
    row = rows[(8.0, recipe.FLOOR)]
    assert row["seeds"] == [0, 1, 2] and row["diffs"] == pytest.approx([0.03, 0.05, 0.02])
    direct = stats.ttest_rel([floor[s] + gain[s] for s in range(3)], [floor[s] for s in range(3)],
                             alternative="greater").pvalue
    assert row["p"] == pytest.approx(direct)
    assert row["p_holm"] == pytest.approx(min(1.0, 2 * direct))  # two comparisons: ε = 4 and ε = 8, equal p
    text = recipe.RecipeStudy().report(stored)["RECIPES.md"]
    assert "Chosen: **packaged**" in text and "64 of 64 report units stored" in text
    assert "ε = 8: beat the floor by ≥ 2.0 points, significant — measured +3.33 over 3 seed(s)" in text


def test_the_selection_table_puts_each_proxy_tasks_score_under_its_name() -> None:
    stored = [_stored(u, 0.8 if u.settings["task"] == "rotten_tomatoes" else 0.6) for u in recipe.select_units()]
    text = recipe.RecipeStudy().report(stored)["RECIPES.md"]
    assert "| recipe | rotten_tomatoes ε = 8 | election_tweets ε = 8 | mean | s / adapter |" in text
    assert "| packaged | 80.0 | 60.0 | 70.0 | 100 |" in text


def test_the_readme_shows_the_level_table_of_the_stored_units() -> None:
    """docs/benchmarks.md's defaults section is the study's export (rerun --report-only after adding units); the
    block is replaced in place, the text around it kept."""
    study = recipe.RecipeStudy()
    for path, text in study.exports(harness.stored(study.name, study.schema)).items():
        assert (harness.REPO / path).read_text() == text, path
    start, end = recipe.README_TABLE_MARKERS
    results = recipe.by_name([_stored(u, 0.7) for u in recipe.select_units()])
    replaced = recipe.with_readme_table(f"before\n{start}\nold\n{end}\nafter\n", results)
    assert replaced == f"before\n{start}\n" + "\n".join(recipe.level_table(results)) + f"\n{end}\nafter\n"
    with pytest.raises(ValueError, match="exactly one"):
        recipe.with_readme_table("no block here", results)
