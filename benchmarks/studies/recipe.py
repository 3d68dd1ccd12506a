"""The recipe benchmark: which one-phase private LoRA recipe to release, against the private linear head (the floor).

``select``: every candidate of :data:`RECIPES` on the proxy tasks at ε = 8, seed 0, scored on validation; the
highest mean is chosen. ``report`` (planned once the select units are stored): the floor, the packaged recipe and
the chosen one on the report tasks (never used to choose) at ε ∈ {1, 4, 8} and non-private, 3 seeds at ε = 4 and 8,
scored on test; one-sided paired t over seeds, Holm. Every unit states :data:`BASE_FLAGS` in full, so a later
change of the defaults does not change what a stored unit means. Report ``benchmarks/reports/recipe/RECIPES.md``;
exports its level table into docs/benchmarks.md; docs/design.md §15.5.

    python -m benchmarks.studies.recipe            # the select stage, then again for the report stage
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import harness
from benchmarks.harness import Unit
from benchmarks.markdown import table_lines
from benchmarks.significance import holm, paired_p
from benchmarks.training import NON_PRIVATE_FLAGS, train_unit
from hf_dpmerge.training.recipe import HEAD_ONLY_RECIPE

PROXY_TASKS = ("rotten_tomatoes", "election_tweets")
"""Recipes are chosen on these tasks' validation splits."""
REPORT_TASKS = ("reuters_r8", "reuters_r52", "20newsgroups", "bbc_news")
"""Reported on their test splits; never used to choose a recipe."""
LEVELS = (1.0, 4.0, 8.0, None)  # None: non-private
SEEDED_EPSILONS = (4.0, 8.0)
REPORT_SEEDS = 3
FLOOR, PACKAGED = "floor", "packaged"
TARGET_GAP = {8.0: 2.0, 4.0: 1.0}  # points the default recipe must beat the floor by, task-averaged
TARGET_RATIO = 0.95  # of the non-private LoRA adapters' task-averaged accuracy, at ε = 8
TARGET_SECONDS = 300.0  # one default adapter on the 2-core machine
README = "docs/benchmarks.md"  # where the level table is exported (once the README)
README_TABLE_MARKERS = ("<!-- recipe-table: copied from benchmarks/reports/recipe/RECIPES.md by its report; a test "
                        "keeps them equal -->", "<!-- /recipe-table -->")
"""docs/benchmarks.md's "task model and DP defaults" table lies between these lines: :func:`level_table`, exported."""
BASE_FLAGS: tuple[str, ...] = (
    "--per_device_train_batch_size", "256", "--physical_batch_size", "64", "--max_steps", "40",
    "--learning_rate", "2e-3", "--head_learning_rate", "2e-2", "--lr_scheduler_type", "constant",
    "--weight_decay", "0.0", "--per_sample_max_grad_norm", "1.0", "--logging_steps", "5", "--save_strategy", "no",
    "--report_to", "none", "--lora_freeze_a", "false", "--head_warmup_steps", "0", "--sam_mode", "dp_sat",
    "--sam_rho", "0.05", "--align_lambda", "0.05", "--lora_layers", "top_half", "--head_phase_share", "0",
)
"""The packaged recipe this benchmark started from (``DP_RECIPE`` then)."""


@dataclass(frozen=True)
class Recipe:
    """A training recipe: train_glue.py flags after :data:`BASE_FLAGS` (later flags win)."""

    flags: tuple[str, ...]
    description: str
    candidate: bool = True  # trained in the select stage


RECIPES: dict[str, Recipe] = {
    FLOOR: Recipe(("--train_lora", "false", *HEAD_ONLY_RECIPE),
                  "frozen encoder + private linear head on cached features (HEAD_ONLY_RECIPE)", candidate=False),
    PACKAGED: Recipe((), "BASE_FLAGS: r = 8 on query/value of the top half, B = 256, 40 steps, lr 2e-3 / head 2e-2"),
    "ffa": Recipe(("--lora_freeze_a", "true"), "BASE_FLAGS with A frozen at its public-seed draw (FFA-LoRA)"),
    "ffa_head_first": Recipe(("--lora_freeze_a", "true", "--head_warmup_steps", "10"),
                             "FFA-LoRA, the first 10 of the 40 steps on the head alone (one accountant)"),
}
Results = dict[str, dict[str, Any]]  # unit name -> stored result


def recipe_unit(stage: str, recipe: str, task: str, epsilon: float | None, seed: int) -> Unit:
    level = "nonprivate" if epsilon is None else f"eps{epsilon:g}"
    privacy = list(NON_PRIVATE_FLAGS) if epsilon is None else ["--target_epsilon", f"{epsilon:g}"]
    return Unit(f"{stage}-{recipe}-{task}-{level}-seed{seed}",
                {"stage": stage, "recipe": recipe, "task": task, "epsilon": epsilon, "seed": seed,
                 "flags": [*BASE_FLAGS, *RECIPES[recipe].flags, *privacy]})


def select_units() -> list[Unit]:
    return [recipe_unit("select", recipe, task, 8.0, 0) for recipe, spec in RECIPES.items() if spec.candidate
            for task in PROXY_TASKS]


def report_units(chosen: str) -> list[Unit]:
    """The report grid for ``chosen``, in the order the targets need it: the floor and ``chosen`` at ε = 8 (every
    seed), non-private, ε = 4 (every seed) and ε = 1; then the packaged recipe in the same order."""
    cells = [(8.0, seed) for seed in range(REPORT_SEEDS)] + [(None, 0)]
    cells += [(4.0, seed) for seed in range(REPORT_SEEDS)] + [(1.0, 0)]
    groups = [(FLOOR, chosen), (PACKAGED,)] if chosen != PACKAGED else [(FLOOR, PACKAGED)]
    return [recipe_unit("report", recipe, task, epsilon, seed) for recipes in groups for epsilon, seed in cells
            for recipe in recipes for task in REPORT_TASKS]


def name(stage: str, recipe: str, task: str, epsilon: float | None, seed: int) -> str:
    return recipe_unit(stage, recipe, task, epsilon, seed).name


def accuracy(result: dict[str, Any]) -> float:
    """A unit's accuracy on its split: validation while choosing, test when reporting."""
    return float(result["metrics"]["accuracy"])


def choose_recipe(results: Results) -> tuple[str | None, dict[str, float]]:
    """The candidate with the highest validation accuracy averaged over the proxy tasks (None while any select unit
    is missing), and every candidate's mean."""
    means: dict[str, float] = {}
    for recipe, spec in RECIPES.items():
        names = [name("select", recipe, task, 8.0, 0) for task in PROXY_TASKS]
        if spec.candidate and all(n in results for n in names):
            means[recipe] = float(np.mean([accuracy(results[n]) for n in names]))
    complete = len(means) == sum(spec.candidate for spec in RECIPES.values())
    return (max(means, key=means.get) if complete and means else None), means


def seed_averages(results: Results, recipe: str, epsilon: float | None) -> dict[int, float]:
    """Per seed with every report task stored: test accuracy averaged over the report tasks."""
    averages = {}
    for seed in range(REPORT_SEEDS):
        names = [name("report", recipe, task, epsilon, seed) for task in REPORT_TASKS]
        if all(n in results for n in names):
            averages[seed] = float(np.mean([accuracy(results[n]) for n in names]))
    return averages


def paired_comparisons(results: Results, chosen: str) -> list[dict[str, Any]]:
    """chosen − floor and chosen − packaged at each seeded ε: the difference of task-averaged test accuracy per
    seed (seeds are the unit), a one-sided paired t-test (H1: chosen is better), Holm-adjusted over the family."""
    rows = []
    for epsilon in SEEDED_EPSILONS:
        for other in dict.fromkeys((FLOOR, PACKAGED)):
            if other == chosen:
                continue
            ours, theirs = seed_averages(results, chosen, epsilon), seed_averages(results, other, epsilon)
            seeds = sorted(set(ours) & set(theirs))
            diffs = np.array([ours[s] - theirs[s] for s in seeds])
            p_value = paired_p([ours[s] for s in seeds], [theirs[s] for s in seeds], alternative="greater")
            rows.append({"epsilon": epsilon, "other": other, "seeds": seeds, "diffs": diffs.tolist(),
                         "mean": float(diffs.mean()) if len(diffs) else math.nan,
                         "p": math.nan if p_value is None else p_value})
    finite = [i for i, row in enumerate(rows) if math.isfinite(row["p"])]
    for i, adjusted in zip(finite, holm([rows[i]["p"] for i in finite]), strict=True):
        rows[i]["p_holm"] = adjusted
    return rows


def _pct(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{100 * value:.1f}"


def _level(epsilon: float | None) -> str:
    return "non-private" if epsilon is None else f"ε = {epsilon:g}"


def render(results: Results) -> str:
    """The report as markdown (complete or not: missing cells show –, and the status line counts them)."""
    chosen, means = choose_recipe(results)
    lines = ["# Recipe benchmark", "",
             "Generated by `python -m benchmarks.studies.recipe --report-only` from `benchmarks/reports/recipe/units/`"
             ". Protocol in `benchmarks/studies/recipe.py`: recipes are chosen on the validation splits of "
             f"{', '.join(PROXY_TASKS)} and reported on the test splits of {', '.join(REPORT_TASKS)} (never used "
             "to choose). Accuracy in %; base model: the packaged all-MiniLM-L6-v2.", "",
             "## Recipes", "", *table_lines(["recipe", "what"], [[n, r.description] for n, r in RECIPES.items()]),
             "", "## Selection (validation accuracy on the proxy tasks, seed 0)", ""]
    rows = []
    for recipe in (r for r, spec in RECIPES.items() if spec.candidate):
        names = [name("select", recipe, task, 8.0, 0) for task in PROXY_TASKS]
        seconds = [results[n]["train_seconds"] for n in names if n in results]
        rows.append([recipe, *(_pct(accuracy(results[n])) if n in results else "–" for n in names),
                     _pct(means.get(recipe)), f"{np.mean(seconds):.0f}" if seconds else "–"])
    lines += table_lines(["recipe", *(f"{t} ε = 8" for t in PROXY_TASKS), "mean", "s / adapter"], rows)
    lines += ["", f"Chosen: **{chosen}**." if chosen else "Chosen: none yet (the select stage is incomplete).", ""]
    planned = report_units(chosen) if chosen else []
    lines += ["## Report tasks (test accuracy, task-averaged; mean ± sd over seeds)", "",
              f"{sum(u.name in results for u in planned)} of {len(planned)} report units stored.", ""]
    recipes = list(dict.fromkeys((FLOOR, PACKAGED, chosen or PACKAGED)))
    lines += level_table(results) + ["", "### Per task (seed 0)", ""]
    rows = []
    for epsilon in LEVELS:
        for recipe in recipes:
            cells = [name("report", recipe, task, epsilon, 0) for task in REPORT_TASKS]
            seconds = [results[c]["train_seconds"] for c in cells if c in results]
            rows.append([_level(epsilon), recipe, *(_pct(accuracy(results[c])) if c in results else "–" for c in cells),
                         f"{np.mean(seconds):.0f}" if seconds else "–"])
    lines += table_lines(["level", "recipe", *REPORT_TASKS, "s / adapter"], rows)
    if chosen:
        lines += ["", "## Seed-level paired tests (chosen − other, task-averaged test accuracy; one-sided paired t, "
                  "Holm over this table)", ""]
        rows = [[_level(r["epsilon"]), f"{chosen} − {r['other']}", ", ".join(f"{100 * d:+.1f}" for d in r["diffs"]),
                 f"{100 * r['mean']:+.2f}" if math.isfinite(r["mean"]) else "–",
                 f"{r['p']:.3g}" if math.isfinite(r["p"]) else "–", f"{r['p_holm']:.3g}" if "p_holm" in r else "–"]
                for r in paired_comparisons(results, chosen)]
        lines += table_lines(["level", "comparison", "per seed (points)", "mean", "p", "p (Holm)"], rows)
        lines += ["", "## Targets", "", *targets(results, chosen)]
    return "\n".join(lines) + "\n"


def level_table(results: Results) -> list[str]:
    """Task-averaged test accuracy per privacy level: the floor, the packaged recipe and the chosen one (mean ± sd
    over the stored seeds)."""
    chosen, _ = choose_recipe(results)
    recipes = list(dict.fromkeys((FLOOR, PACKAGED, chosen or PACKAGED)))
    rows = []
    for epsilon in LEVELS:
        row = [_level(epsilon)]
        for recipe in recipes:
            values = list(seed_averages(results, recipe, epsilon).values())
            row.append("–" if not values else f"{_pct(np.mean(values))} ± {100 * np.std(values, ddof=1):.1f} "
                       f"(n = {len(values)})" if len(values) > 1 else f"{_pct(values[0])} (n = 1)")
        rows.append(row)
    return table_lines(["level", *recipes], rows)


def with_readme_table(readme: str, results: Results) -> str:
    """``readme`` with the lines between :data:`README_TABLE_MARKERS` replaced by :func:`level_table`."""
    start, end = README_TABLE_MARKERS
    if readme.count(start) != 1 or readme.count(end) != 1:
        raise ValueError(f"the document needs exactly one {start!r} … {end!r} block for the recipe table")
    head, rest = readme.split(start)
    return head + start + "\n" + "\n".join(level_table(results)) + "\n" + end + rest.split(end, 1)[1]


def targets(results: Results, chosen: str) -> list[str]:
    """Each target of the recipe benchmark with its measured value and whether it holds."""
    lines = []
    tests = {(r["epsilon"], r["other"]): r for r in paired_comparisons(results, chosen)}
    for epsilon, gap in TARGET_GAP.items():
        row = tests.get((epsilon, FLOOR))
        if row is None or not row["seeds"]:
            lines.append(f"- {_level(epsilon)}: beat the floor by ≥ {gap} points — not measured yet.")
            continue
        holds = row["mean"] * 100 >= gap and row.get("p_holm", 1.0) < 0.05
        lines.append(f"- {_level(epsilon)}: beat the floor by ≥ {gap} points, significant — measured "
                     f"{100 * row['mean']:+.2f} over {len(row['seeds'])} seed(s), Holm p = "
                     f"{row.get('p_holm', math.nan):.3g}: {'holds' if holds else 'does not hold'}.")
    private, public = seed_averages(results, chosen, 8.0), seed_averages(results, chosen, None)
    if private and public:
        ratio = np.mean(list(private.values())) / np.mean(list(public.values()))
        lines.append(f"- ε = 8 reaches ≥ {100 * TARGET_RATIO:.0f} % of non-private: measured {100 * ratio:.1f} %: "
                     f"{'holds' if ratio >= TARGET_RATIO else 'does not hold'}.")
    seconds = [r["train_seconds"] for n, r in results.items() if n.startswith(f"report-{chosen}-")]
    if seconds:
        lines.append(f"- one adapter in ≤ {TARGET_SECONDS / 60:.0f} min: measured {np.mean(seconds) / 60:.1f} min on "
                     f"average ({len(seconds)} adapters, max {max(seconds) / 60:.1f}): "
                     f"{'holds' if np.mean(seconds) <= TARGET_SECONDS else 'does not hold'}.")
    return lines


def by_name(stored: list[dict[str, Any]]) -> Results:
    """Each stored unit's result, its accuracy on its split as ``metrics``."""
    return {u["name"]: {**u["result"], "metrics": u["result"]["validation" if u["settings"]["stage"] == "select"
                                                              else "test"]} for u in stored}


class RecipeStudy(harness.Study, name="recipe", schema=1):
    def plan(self, args: argparse.Namespace) -> list[Unit]:
        chosen, _ = choose_recipe(by_name(harness.Store(args.units_dir, self.schema).results()))
        return select_units() + (report_units(chosen) if chosen else [])

    def run(self, unit: Unit, work_dir: Path) -> dict[str, Any]:
        s = unit.settings
        return train_unit(s["task"], s["flags"], s["seed"], work_dir, unit.name)

    def report(self, stored: list[dict[str, Any]]) -> dict[str, str]:
        return {"RECIPES.md": render(by_name(stored))}

    def exports(self, stored: list[dict[str, Any]]) -> dict[str, str]:
        return {README: with_readme_table((harness.REPO / README).read_text(), by_name(stored))}


if __name__ == "__main__":
    sys.exit(harness.main(RecipeStudy()))
