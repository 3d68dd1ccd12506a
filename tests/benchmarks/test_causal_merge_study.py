"""The causal paper's-question study: kept adapters found per seed through the causal_recipe study's units, each
packaged causal config merged as stored, and the report built from the stored units with the zero-shot base as the
floor."""

import argparse
from pathlib import Path

import pytest
import yaml

from benchmarks import harness
from benchmarks.causal import CONFIGS, causal_parameters, merge_config
from benchmarks.merging import METHODS
from benchmarks.studies.causal_merge import TASKS, TRAINERS, CausalMerge, merge_units

REPO = Path(__file__).resolve().parents[2]


def recipe_unit(kept: Path, task: str, candidate: str, seed: int, keep: bool = True) -> dict:
    name = f"{task}-{candidate}-test-eps8-seed{seed}"
    if keep:
        (kept / name / task / "adapter").mkdir(parents=True)
    return {"name": name, "settings": {"stage": "train", "task": task, "candidate": candidate, "split": "test",
                                       "epsilon": 8.0, "seed": seed}, "result": {}}


def test_a_seed_merges_only_when_both_trainers_kept_every_task(tmp_path: Path, monkeypatch):
    units = [recipe_unit(tmp_path, t, c, 1) for t in TASKS for c in TRAINERS.values()]
    units += [recipe_unit(tmp_path, "bbc_news", TRAINERS["dp_sgd"], 2),
              *(recipe_unit(tmp_path, t, c, 3, keep=False) for t in TASKS for c in TRAINERS.values())]
    monkeypatch.setattr(harness, "stored", lambda study, schema: units if study == "causal_recipe" else [])
    parser = argparse.ArgumentParser()
    CausalMerge().add_arguments(parser)
    plan = CausalMerge().plan(parser.parse_args(["--kept", str(tmp_path), "--methods", "ties"]))
    assert [u.name for u in plan] == ["zero_shot", "dp_sgd-seed1-individual", "dp_sgd-seed1-ties",
                                      "dp_merging-seed1-individual", "dp_merging-seed1-ties"]
    assert plan[2].settings["merge_parameters"] == causal_parameters("ties")
    with pytest.raises(ValueError, match="unknown"):
        CausalMerge().plan(parser.parse_args(["--kept", str(tmp_path), "--methods", "linear"]))


@pytest.mark.parametrize("method", METHODS)
def test_each_method_merges_with_its_packaged_causal_configs_parameters(tmp_path: Path, method: str):
    assert CONFIGS[method].startswith("causal_")
    packaged = yaml.safe_load((REPO / "merge_configs" / CONFIGS[method]).read_text())
    config = merge_config(method, tmp_path / "runs_causal", ["election_tweets", "bbc_news"], causal_parameters(method))
    assert config["merge_method"] == packaged["merge_method"] and config["parameters"] == packaged["parameters"]
    assert [m["model"] for m in config["models"]] == [
        f"{tmp_path}/runs_causal/base+{tmp_path}/runs_causal/{t}/adapter" for t in ("election_tweets", "bbc_news")]


def stored_units(merged: dict[tuple[str, int], tuple[float, float]]) -> list[dict]:
    def unit(trainer, seed, what, accuracies):
        return {"name": "zero_shot" if trainer is None else f"{trainer}-seed{seed}-{what}",
                "settings": {"trainer": trainer, "seed": seed, "what": what, "tasks": list(TASKS)},
                "result": {"scores": {t: {"accuracy": a, "num_examples": 100} for t, a in zip(TASKS, accuracies)}}}

    stored = [unit(None, 0, "zero_shot", (0.50, 0.30))]
    for (trainer, seed), accuracies in merged.items():
        stored += [unit(trainer, seed, "individual", (0.60, 0.50)), unit(trainer, seed, "ties", accuracies)]
    return stored


def test_the_report_measures_gain_retained_over_zero_shot_and_pairs_trainers_by_seed():
    """Gain retained = (merged − zero-shot) / (individual − zero-shot) on task averages; a merge whose seed lacks
    its individual unit is left out rather than compared with another seed's adapters."""
    merged = {("dp_sgd", 0): (0.55, 0.40), ("dp_merging", 0): (0.60, 0.40)}
    stored = [u for u in stored_units(merged) if u["name"] != "dp_merging-seed0-individual"]
    units, floors = merge_units(stored)
    assert [(u["trainer"], u["method"]) for u in units] == [("dp_sgd", "ties")]
    assert floors == {("election_tweets", 0): 50.0, ("bbc_news", 0): 30.0}
    text = CausalMerge().report(stored_units(merged))["MERGE.md"]
    sgd = next(line for line in text.splitlines() if line.startswith("| ties | dp_sgd |"))
    floor, individual, merged_sgd = 40.0, 55.0, 47.5
    assert f"| {floor:.1f} | {individual:.1f} | {merged_sgd:.1f} |" in sgd
    assert f"{100 * (merged_sgd - floor) / (individual - floor):.0f} %" in sgd
    assert "| ties | 0 | +2.50 | +2.50 | — | — |" in text  # one seed: no test
