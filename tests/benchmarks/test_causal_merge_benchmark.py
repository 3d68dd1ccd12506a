"""The causal paper's-question benchmark: kept adapters found per seed, each packaged causal config merged as
stored, and the report built from the stored units with the zero-shot base as the floor."""

from pathlib import Path

import pytest
import yaml

from benchmarks import causal_merge
from benchmarks.merging import METHODS

REPO = Path(__file__).resolve().parents[2]


def test_a_seed_merges_only_when_both_trainers_kept_every_task(tmp_path: Path):
    for trainer in causal_merge.TRAINERS:
        for task in causal_merge.TASKS:
            (causal_merge.kept_run(tmp_path, task, trainer, 1) / "adapter").mkdir(parents=True)
    (causal_merge.kept_run(tmp_path, "bbc_news", "dp_sgd", 2) / "adapter").mkdir(parents=True)
    assert causal_merge.complete_seeds(tmp_path, list(causal_merge.TASKS)) == [1]
    # the kept folder is the recipe benchmark's report unit at ε = 8 on test
    assert causal_merge.kept_run(tmp_path, "bbc_news", "dp_merging", 1).parent.name == \
        "bbc_news-b1600_t12_lr1e-2+dp_merging-test-eps8-seed1"


@pytest.mark.parametrize("method", METHODS)
def test_each_method_merges_with_its_packaged_causal_configs_parameters(tmp_path: Path, method: str):
    assert causal_merge.CONFIGS[method].startswith("causal_")
    config = causal_merge.merge_config(method, tmp_path / "runs_causal", ["election_tweets", "bbc_news"])
    packaged = yaml.safe_load((REPO / "merge_configs" / causal_merge.CONFIGS[method]).read_text())
    assert config["merge_method"] == packaged["merge_method"] and config["parameters"] == packaged["parameters"]
    assert [m["model"] for m in config["models"]] == [
        f"{tmp_path}/runs_causal/base+{tmp_path}/runs_causal/{t}/adapter" for t in ("election_tweets", "bbc_news")]


def stored_units(merged: dict[tuple[str, int], tuple[float, float]]) -> dict[str, dict]:
    tasks = list(causal_merge.TASKS)

    def unit(trainer, seed, what, accuracies):
        return {"trainer": trainer, "seed": seed, "what": what, "tasks": tasks,
                "scores": {t: {"accuracy": a, "num_examples": 100} for t, a in zip(tasks, accuracies)}}

    stored = {"zero_shot": unit(None, 0, "zero_shot", (0.50, 0.30))}
    for (trainer, seed), accuracies in merged.items():
        stored[causal_merge.unit_name(trainer, seed, "individual")] = unit(trainer, seed, "individual", (0.60, 0.50))
        stored[causal_merge.unit_name(trainer, seed, "ties")] = unit(trainer, seed, "ties", accuracies)
    return stored


def test_the_report_measures_gain_retained_over_zero_shot_and_pairs_trainers_by_seed(tmp_path: Path):
    """Gain retained = (merged − zero-shot) / (individual − zero-shot) on task averages; a merge whose seed lacks
    its individual unit is left out rather than compared with another seed's adapters."""
    merged = {("dp_sgd", 0): (0.55, 0.40), ("dp_merging", 0): (0.60, 0.40)}
    stored = stored_units(merged)
    stored.pop(causal_merge.unit_name("dp_merging", 0, "individual"))
    units, floors = causal_merge.merge_units(stored)
    assert [(u["trainer"], u["method"]) for u in units] == [("dp_sgd", "ties")]
    assert floors == {("election_tweets", 0): 50.0, ("bbc_news", 0): 30.0}
    text = causal_merge.write_report(stored_units(merged), tmp_path / "MERGE.md")
    sgd = next(line for line in text.splitlines() if line.startswith("| ties | dp_sgd |"))
    floor, individual, merged_sgd = 40.0, 55.0, 47.5
    assert f"| {floor:.1f} | {individual:.1f} | {merged_sgd:.1f} |" in sgd
    assert f"{100 * (merged_sgd - floor) / (individual - floor):.0f} %" in sgd
    assert "| ties | 0 | +2.50 | +2.50 | — | — |" in text  # one seed: no test
    assert (tmp_path / "MERGE.md").read_text() == text
