"""The recipe benchmark's report (``benchmarks/reports/recipe/RECIPES.md``): the selection on the proxy tasks, the
report tasks' test accuracy per recipe and ε, seed-level paired tests with Holm's correction, and the targets."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from benchmarks.markdown import table_lines

from .grid import (
    FLOOR,
    PACKAGED,
    PROXY_TASKS,
    RECIPES,
    REPORT_TASKS,
    SEEDED_EPSILONS,
    SELECT_EPSILONS,
    Unit,
    report_units,
    select_units,
)

Results = dict[str, dict[str, Any]]  # unit name -> stored result
TARGET_GAP = {8.0: 2.0, 4.0: 1.0}  # points the default recipe must beat the floor by, task-averaged
TARGET_RATIO = 0.95  # of the non-private LoRA adapters' task-averaged accuracy, at ε = 8
TARGET_SECONDS = 300.0  # one default adapter on the 2-core machine
README = Path(__file__).resolve().parents[2] / "README.md"
README_TABLE_MARKERS = ("<!-- recipe-table: copied from benchmarks/reports/recipe/RECIPES.md by its report; a test "
                        "keeps them equal -->", "<!-- /recipe-table -->")
"""The README's "task model and DP defaults" table, between these lines: :func:`level_table`, rewritten with the
report."""


def accuracy(result: dict[str, Any]) -> float:
    return float(result["metrics"]["accuracy"])


def choose_recipe(results: Results) -> tuple[str | None, dict[str, float]]:
    """The candidate with the highest validation accuracy averaged over the proxy tasks and ε of the select stage
    (None while any select unit is missing), and every candidate's mean."""
    means: dict[str, float] = {}
    for recipe, spec in RECIPES.items():
        if not spec.candidate:
            continue
        units = [u for u in select_units() if u.recipe == recipe]
        if all(u.name in results for u in units):
            means[recipe] = float(np.mean([accuracy(results[u.name]) for u in units]))
    complete = len(means) == sum(spec.candidate for spec in RECIPES.values())
    return (max(means, key=means.get) if complete and means else None), means


def task_average(results: Results, recipe: str, epsilon: float | None, seed: int) -> float | None:
    """Test accuracy averaged over the report tasks, or None while a task's unit is missing."""
    names = [Unit("report", recipe, task, epsilon, seed).name for task in REPORT_TASKS]
    return float(np.mean([accuracy(results[n]) for n in names])) if all(n in results for n in names) else None


def seed_averages(results: Results, recipe: str, epsilon: float | None) -> dict[int, float]:
    return {seed: value for seed in range(3) if (value := task_average(results, recipe, epsilon, seed)) is not None}


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values: p_(i) ← max_{j ≤ i} min(1, (m − j + 1)·p_(j)) in ascending order."""
    order = np.argsort(p_values)
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


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
            p_value = (float(stats.ttest_rel([ours[s] for s in seeds], [theirs[s] for s in seeds],
                                             alternative="greater").pvalue)
                       if len(seeds) >= 2 and np.std(diffs) > 0 else math.nan)
            rows.append({"epsilon": epsilon, "other": other, "seeds": seeds, "diffs": diffs.tolist(),
                         "mean": float(diffs.mean()) if len(diffs) else math.nan, "p": p_value})
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
             "Generated by `python -m benchmarks.recipe --report-only` from `benchmarks/reports/recipe/units/`. "
             "Protocol in `benchmarks/recipe/__init__.py`: recipes are chosen on the validation splits of "
             f"{', '.join(PROXY_TASKS)} and reported on the test splits of {', '.join(REPORT_TASKS)} (never used "
             "to choose). Accuracy in %; base model: the packaged all-MiniLM-L6-v2.", "",
             "## Recipes", "", *table_lines(["recipe", "what"], [[name, r.description] for name, r in RECIPES.items()]),
             "", "## Selection (validation accuracy on the proxy tasks, seed 0)", ""]
    header = ["recipe", *(f"{t} {_level(e)}" for e in SELECT_EPSILONS for t in PROXY_TASKS), "mean", "s / adapter"]
    rows = []
    for recipe, spec in RECIPES.items():
        if not spec.candidate:
            continue
        units = [u for u in select_units() if u.recipe == recipe]
        seconds = [results[u.name]["train_seconds"] for u in units if u.name in results]
        rows.append([recipe, *(_pct(accuracy(results[u.name])) if u.name in results else "–" for u in
                               sorted(units, key=lambda u: (u.epsilon, u.task)))],
                    )
        rows[-1] += [_pct(means.get(recipe)), f"{np.mean(seconds):.0f}" if seconds else "–"]
    lines += table_lines(header, rows)
    lines += ["", f"Chosen: **{chosen}**." if chosen else "Chosen: none yet (the select stage is incomplete).", ""]
    done = sum(u.name in results for u in (report_units(chosen) if chosen else []))
    total = len(report_units(chosen)) if chosen else 0
    lines += ["## Report tasks (test accuracy, task-averaged; mean ± sd over seeds)", "",
              f"{done} of {total} report units stored.", ""]
    recipes = list(dict.fromkeys((FLOOR, PACKAGED, chosen or PACKAGED)))
    lines += level_table(results)
    lines += ["", "### Per task (seed 0)", ""]
    rows = []
    for epsilon in (1.0, 4.0, 8.0, None):
        for recipe in recipes:
            cells = [Unit("report", recipe, task, epsilon, 0).name for task in REPORT_TASKS]
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
    for epsilon in (1.0, 4.0, 8.0, None):
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
        raise ValueError(f"the README needs exactly one {start!r} … {end!r} block for the recipe table")
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
    private = seed_averages(results, chosen, 8.0)
    public = seed_averages(results, chosen, None)
    if private and public:
        ratio = np.mean(list(private.values())) / np.mean(list(public.values()))
        lines.append(f"- ε = 8 reaches ≥ {100 * TARGET_RATIO:.0f} % of non-private: measured {100 * ratio:.1f} %: "
                     f"{'holds' if ratio >= TARGET_RATIO else 'does not hold'}.")
    seconds = [r["train_seconds"] for name, r in results.items() if name.startswith(f"report/{chosen}-")]
    if seconds:
        lines.append(f"- one adapter in ≤ {TARGET_SECONDS / 60:.0f} min: measured {np.mean(seconds) / 60:.1f} min on "
                     f"average ({len(seconds)} adapters, max {max(seconds) / 60:.1f}): "
                     f"{'holds' if np.mean(seconds) <= TARGET_SECONDS else 'does not hold'}.")
    return lines


def write_report(results: Results, path: Path, log: Callable[[str], None] = print, readme: Path = README) -> Path:
    """Write the report to ``path`` and the level table into ``readme`` (the gap ``hf-dpmerge recommend`` reads
    is the LP-FT benchmark's since LP-FT became the default: ``benchmarks/studies/lpft.py``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(results))
    readme.write_text(with_readme_table(readme.read_text(), results))
    log(f"wrote {path} and the table in {readme}")
    return path
