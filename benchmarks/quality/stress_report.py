"""BENCHMARKS_STRESS.md from the stress grid's stored results (``python -m benchmarks.quality --grid stress``).

Accuracies are in percent on the test subsets, unweighted means over tasks; "± x" is the sample standard deviation
over seeds. Gain retained = (merged − floor)/(individual − floor) per seed on the task-averaged accuracies
(:mod:`.floor`), then averaged over seeds; undefined where the adapters do not beat the floor.
Each merge is its method's point chosen on validation (:mod:`.tuning`); "best" among methods is also decided on
the validation means, never on test. Paired comparisons treat seeds as the unit and examples as samples within
a seed, and every comparison of a report is one Holm family (:mod:`benchmarks.significance`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.markdown import mean_sd, table
from benchmarks.significance import ALPHA, Comparison, adjust, compare
from hf_dpmerge.data.metrics import gain_retained

from .floor import floor_group
from .grid import FLOOR_TRAINER, HEADLINE_EPSILON, NON_PRIVATE_FLOOR_FLAGS, Cell, Grid
from .merge_space import BUDGET, FIXED, SCALE, SPACES, grid_edges, point_label
from .scoring import decode
from .store import Store

Group = tuple[str, float | None]  # (trainer, ε) or ("noise", σ)
Settings = Callable[[Cell, str], dict[str, Any]]
OURS = ("cauchy_poe", "dp_aware")
REPORT_NAME = "BENCHMARKS_STRESS.md"
EVIDENCE_NAME = "recommend_evidence.json"  # what hf-dpmerge recommend reads (its data/benchmark_evidence.json)


def group_of(cell: Cell) -> Group:
    return ("noise", cell.noise_std) if cell.noise_std is not None else (cell.trainer, cell.epsilon)


def label(group: Group) -> str:
    if group[0] == "noise":
        return f"noise σ={group[1]:g}"
    return group[0] if group[1] is None else f"{group[0]} ε={group[1]:g}"


class StressResults:
    """The stored stress units of a grid's cells, by group and seed."""

    def __init__(self, store: Store, grid: Grid, cells: Sequence[Cell], settings: Settings):
        self.grid = grid
        self.individual: dict[Group, dict[int, dict]] = defaultdict(dict)
        self.tuned: dict[Group, dict[str, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
        self.trained: dict[Group, list[dict]] = defaultdict(list)
        self.missing: list[str] = []
        for cell in cells:
            group = group_of(cell)
            units = ["individual", *(f"tune_{m}" for m in grid.merges if cell.merged)]
            if cell.noise_std is None:
                units += [f"train_{t}" for t in grid.tasks]
            for unit in units:
                result = store.load(cell, unit, settings(cell, unit))
                if result is None:
                    self.missing.append(f"{cell.name} {unit}")
                elif unit == "individual":
                    self.individual[group][cell.seed] = result
                elif unit.startswith("tune_"):
                    self.tuned[group][unit.removeprefix("tune_")][cell.seed] = result
                else:
                    self.trained[group].append(result)

    def groups(self) -> list[Group]:
        """Trained groups (non-private first, then by trainer and ε), then the noise arm by σ."""
        order = {t: i for i, t in enumerate(self.grid.trainers)}
        keys = [g for g in self.individual if g[0] != FLOOR_TRAINER]
        return sorted(keys, key=lambda g: (g[0] == "noise", g[1] is not None, order.get(g[0], 0), g[1] or 0))

    def individual_accuracy(self, group: Group) -> dict[int, dict[str, float]]:
        """Per seed, per task test accuracy of the group's own adapters."""
        return {seed: r["accuracy"]["test"] for seed, r in self.individual.get(group, {}).items()}

    def merged_accuracy(self, group: Group, method: str) -> dict[int, dict[str, float]]:
        return {seed: r["test"] for seed, r in self.tuned.get(group, {}).get(method, {}).items()}

    def floor_accuracy(self, group: Group) -> dict[str, float] | None:
        """Per task test accuracy of the group's floor, averaged over the floor's seeds (noise arm: non-private)."""
        floor = floor_group(("non_private", None) if group[0] == "noise" else group)
        runs = self.individual_accuracy(floor)
        if not runs:
            return None
        return {task: statistics.fmean(r[task] for r in runs.values()) for task in self.grid.tasks}

    def per_seed_mean(self, by_seed: dict[int, dict[str, float]]) -> list[float]:
        return [100 * statistics.fmean(r.values()) for r in by_seed.values()]

    def gain(self, group: Group, method: str) -> list[float]:
        """Per seed, the gain retained on task-averaged accuracies; seeds whose adapters do not beat the floor
        on average are left out (a per-task ratio over a near-zero denominator is not a measurement)."""
        floor, individual = self.floor_accuracy(group), self.individual_accuracy(group)
        if floor is None:
            return []
        floor_mean, out = statistics.fmean(floor.values()), []
        for seed, merged in self.merged_accuracy(group, method).items():
            if seed in individual:
                gain = gain_retained(statistics.fmean(merged.values()), statistics.fmean(individual[seed].values()),
                                     floor_mean)
                if gain is not None:
                    out.append(100 * gain)
        return out

    def below_floor(self, group: Group) -> bool:
        """Whether the group's own adapters score at or below its floor on average (test): gain is undefined."""
        floor, individual = self.floor_accuracy(group), self.per_seed_mean(self.individual_accuracy(group))
        return floor is not None and bool(individual) and statistics.fmean(individual) <= 100 * statistics.fmean(
            floor.values())

    def floor_validation_mean(self, group: Group) -> float | None:
        """The floor's mean validation accuracy over tasks and seeds (None for the noise arm or when unmeasured)."""
        if group[0] == "noise":
            return None
        runs = self.individual.get(floor_group(group), {}).values()
        values = [statistics.fmean(r["accuracy"]["validation"].values()) for r in runs]
        return statistics.fmean(values) if values else None

    def validation_mean(self, group: Group, method: str) -> float | None:
        """The chosen point's validation mean accuracy, averaged over seeds: what "best method" is decided on."""
        rows = self.tuned.get(group, {}).get(method, {}).values()
        values = [r["trials"][r["selected"]]["mean"] for r in rows]
        return statistics.fmean(values) if values else None

    def example_ids(self, group: Group) -> dict[tuple[int, str], list[int]] | None:
        """Per (seed, task), the test examples the group was scored on (indices into the task's test split),
        or None for results scored on the fixed subset every seed shares (stored without indices)."""
        rows = self.individual.get(group, {})
        if not rows or any("examples" not in row for row in rows.values()):
            return None
        return {(seed, task): ids for seed, row in rows.items() for task, ids in row["examples"]["test"].items()}

    def correct(self, group: Group, method: str | None) -> dict[tuple[int, str], np.ndarray]:
        """Per (seed, task), the test 0/1 vector of the group's merge (``method``) or own adapters (None)."""
        rows = (self.individual.get(group, {}) if method is None
                else self.tuned.get(group, {}).get(method, {}))
        out = {}
        for seed, row in rows.items():
            stored = row["correct"]["test"] if method is None else row["correct"]
            out.update({(seed, task): values for task, values in decode(stored).items()})
        return out

    def best(self, group: Group, methods: Sequence[str]) -> str | None:
        """The method of ``methods`` with the highest validation mean (None if none was measured)."""
        scored = [(self.validation_mean(group, m), m) for m in methods if self.validation_mean(group, m) is not None]
        return max(scored)[1] if scored else None

    def seconds(self) -> float:
        rows = [r for by in self.tuned.values() for m in by.values() for r in m.values()]
        rows += [r for by in self.individual.values() for r in by.values()]
        rows += [r for rs in self.trained.values() for r in rs]
        return sum(sum(r["seconds"].values()) for r in rows)


def comparison(results: StressResults, first: tuple[Group, str | None], second: tuple[Group, str | None]
               ) -> Comparison | None:
    """Paired comparison of two (group, method) models on the (seed, task) strata both were scored on."""
    a, b = results.correct(*first), results.correct(*second)
    common = sorted(set(a) & set(b))
    if not common:
        return None
    names = [f"{label(group)} {method or 'individual'}" for group, method in (first, second)]
    ids = results.example_ids(first[0])
    return compare(names[0], {k: a[k] for k in common}, names[1], {k: b[k] for k in common},
                   example_ids=None if ids is None else {k: ids[k] for k in common})


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None




def _describe(c: Comparison) -> str:
    verdict = "significant" if c.significant else "not significant"
    counts = f"; {c.first_only} vs {c.second_only} discordant" if c.test == "exact McNemar" else ""
    return (f"{c.difference:+.1f} points (95 % cluster-bootstrap CI {c.ci_low:+.1f} to {c.ci_high:+.1f}; "
            f"{c.test} p = {c.p_value:.3g}, Holm-adjusted over {c.family} comparisons p = {c.p_adjusted:.3g}; "
            f"{c.seeds} seed{'s' if c.seeds != 1 else ''}, {c.distinct_examples} distinct test examples{counts}; "
            f"{verdict})")


def _choice(method: str, point: dict[str, Any]) -> str:
    """The chosen point, flagged where it sits at an end of its grid."""
    return point_label(point) + (" **(edge)**" if grid_edges(method, point) else "")


def _margin(versus: str, c: Comparison) -> str:
    return f"vs {versus}: {c.difference:+.1f} ({'significant' if c.significant else 'n.s.'})"


# ---------------------------------------------------------------------------------------------- targets


def headline_comparisons(results: StressResults) -> list[tuple[str, Comparison]]:
    """The headline comparisons: DP-Merging vs DP-SGD under ties at ε = 4; best of ours vs best stock per group."""
    out = []
    ties = comparison(results, (("dp_merging", HEADLINE_EPSILON), "ties"), (("dp_sgd", HEADLINE_EPSILON), "ties"))
    if ties is not None:
        out.append(("ties, ε = 4: DP-Merging vs DP-SGD", ties))
    stock = [m for m in results.grid.merges if m not in OURS]
    for group in results.groups():
        ours, theirs = results.best(group, [m for m in OURS if m in results.grid.merges]), results.best(group, stock)
        if ours and theirs:
            found = comparison(results, (group, ours), (group, theirs))
            if found is not None:
                out.append((f"{label(group)}: best of ours ({ours}) vs best stock ({theirs})", found))
    return out


def targets(comparisons: list[tuple[str, Comparison]], rows: list[list[str]]) -> list[str]:
    """The stress benchmark's three targets (docs/benchmarks.md), each judged on the (Holm-adjusted) paired
    comparisons; ``rows``: the "which method when" table."""
    by_title = dict(comparisons)
    lines = []
    ties = by_title.get("ties, ε = 4: DP-Merging vs DP-SGD")
    if ties is None:
        lines.append("1. TIES at ε = 4, DP-Merging − DP-SGD ≥ +3 points, significant: not measured in this grid")
    else:
        ok = ties.difference >= 3.0 and ties.significant and ties.difference > 0
        lines.append(f"1. TIES at ε = 4, DP-Merging − DP-SGD ≥ +3 points, significant: "
                     f"{'**holds**' if ok else '**does not hold**'} — {_describe(ties)}")
    checks = []
    for title, c in comparisons:
        if "best of ours" not in title:
            continue
        group_label = title.split(":")[0]
        if group_label.startswith("noise") or "ε=8" in group_label:
            continue
        if group_label in ("non_private",):
            ok = not (c.significant and c.difference < 0)
            checks.append((f"{title} (not worse)", ok, c))
        else:
            ok = c.difference >= 1.0 and c.significant
            checks.append((f"{title} (≥ +1 point, significant)", ok, c))
    if not checks:
        lines.append("2. Better of cauchy_poe / dp_aware ≥ best stock + 1 point on DP adapters at ε ∈ {1, 4}, "
                     "not worse on non-private: not measured in this grid")
    else:
        overall = all(ok for _, ok, _ in checks)
        lines.append("2. Better of cauchy_poe / dp_aware ≥ best stock + 1 point, significant, on DP adapters at "
                     f"ε ∈ {{1, 4}}; not worse on non-private: {'**holds**' if overall else '**does not hold**'}")
        lines += [f"  - {t}: {'holds' if ok else 'does not hold'} — {_describe(c)}" for t, ok, c in checks]
    lines.append("3. A \"which method when\" table drawn from measured results: "
                 + ("**holds** — see below (the README links to it)" if rows else "not measured in this grid"))
    return lines


Margin = tuple[int, str, Comparison]  # (row, the model compared against, its comparison): the row's margin cell


def which_method_when(results: StressResults) -> tuple[list[list[str]], list[Margin], list[dict[str, Any]]]:
    """Per privacy level (and noise level): the trainer and merge a user should pick, from the validation means,
    with the merge's test accuracy, the interference it leaves, and its margin over the runner-up merge.

    The floor at the same ε (base encoder + each task's own head: a multi-task model that needs no merge) is a
    candidate too; where its validation mean beats every merge's, it is the recommendation and the margin is
    its paired test difference to the best merge. The margins' comparisons are returned apart, for the report's
    Holm family (:func:`fill_margins` writes them into the rows), and the rows as data for
    ``hf-dpmerge recommend`` (:func:`evidence`)."""
    rows, margins, entries = [], [], []
    levels: dict[Any, list[Group]] = defaultdict(list)
    for group in results.groups():
        levels[("noise", group[1]) if group[0] == "noise" else ("ε", group[1])].append(group)
    for (kind, level), groups in levels.items():
        candidates = [(results.validation_mean(g, m), g, m) for g in groups for m in results.grid.merges
                      if results.validation_mean(g, m) is not None]
        if not candidates:
            continue
        candidates.sort(key=lambda c: c[0], reverse=True)
        _, group, method = candidates[0]
        setting = f"noise σ = {level:g} (non-private adapters)" if kind == "noise" else (
            "non-private" if level is None else f"ε = {level:g}")
        floor_validation = results.floor_validation_mean(group)
        floor_accuracy = results.floor_accuracy(group)
        entry = {"epsilon": level if kind == "ε" else None, "noise_std": level if kind == "noise" else None,
                 "floor": None if floor_accuracy is None else 100 * statistics.fmean(floor_accuracy.values()),
                 "individual": _mean(results.per_seed_mean(results.individual_accuracy(group))),
                 "max_abs_cosine": None}  # the stress grid does not measure its adapters' similarity
        if floor_validation is not None and floor_validation > candidates[0][0]:
            floor = floor_group(group)
            entries.append({**entry, "choice": "floor", "trainer": floor[0], "merge": None, "point": None,
                            "accuracy": entry["floor"]})
            found = comparison(results, (floor, None), (group, method))
            if found is not None:
                margins.append((len(rows), f"{group[0]} + {method}", found))
            rows.append([setting, str(len(results.grid.tasks)), "0 (no merge)", f"{floor[0]} (LoRA frozen)",
                         "none: base encoder + each task's head",
                         mean_sd(results.per_seed_mean(results.individual_accuracy(floor))), "–"])
            continue
        runner = next((c for c in candidates[1:] if c[1] == group), None)
        merged = results.per_seed_mean(results.merged_accuracy(group, method))
        individual = results.per_seed_mean(results.individual_accuracy(group))
        interference = (f"{statistics.fmean(individual) - statistics.fmean(merged):.1f}"
                        if merged and individual else "–")
        if runner is not None:
            found = comparison(results, (group, method), (group, runner[2]))
            if found is not None:
                margins.append((len(rows), runner[2], found))
        rows.append([setting, str(len(results.grid.tasks)), interference, group[0] if kind != "noise" else "–",
                     method, mean_sd(merged), "–"])
        points = [point_label(r["point"]) for r in results.tuned[group][method].values()]
        chosen = max(results.tuned[group][method].values(), key=lambda r: points.count(point_label(r["point"])))
        entries.append({**entry, "choice": "merge", "trainer": group[0], "merge": method, "point": chosen["point"],
                        "accuracy": _mean(merged)})
    return rows, margins, entries


def evidence(entries: list[dict[str, Any]], margins: list[Margin], report: str, configuration: str
             ) -> dict[str, Any]:
    """The "Which method when" rows as ``hf-dpmerge recommend`` reads them (its ``benchmark_evidence.json``
    ``settings``), each with its (Holm-adjusted) margin."""
    rows = [{"report": report, "configuration": configuration, **entry, "versus": None, "difference": None,
             "significant": None, "test": None, "seeds": None} for entry in entries]
    for row, versus, found in margins:
        rows[row].update(versus=versus, difference=found.difference, significant=found.significant,
                         test=f"{found.test}, Holm-adjusted p = {found.p_adjusted:.3g} over {found.family}",
                         seeds=found.seeds)
    return {"settings": rows}


def fill_margins(rows: list[list[str]], margins: list[Margin]) -> list[list[str]]:
    """``rows`` with each margin cell written from its (adjusted) comparison."""
    for row, versus, found in margins:
        rows[row][-1] = _margin(versus, found)
    return rows


def one_family(comparisons: list[tuple[str, Comparison]], margins: list[Margin]
               ) -> tuple[list[tuple[str, Comparison]], list[Margin]]:
    """Every comparison the report states, Holm-adjusted as one family (a pair of models stated twice, e.g. a
    headline comparison that is also a margin, counts once)."""
    stated = [c for _, c in comparisons] + [c for _, _, c in margins]
    unique = {frozenset((c.first, c.second)): c for c in stated}
    corrected = dict(zip(unique, adjust(list(unique.values()))))
    adjusted = [dataclasses.replace(c, p_adjusted=corrected[key].p_adjusted, family=len(unique))
                for c in stated for key in [frozenset((c.first, c.second))]]
    return ([(title, c) for (title, _), c in zip(comparisons, adjusted)],
            [(row, versus, c) for (row, versus, _), c in zip(margins, adjusted[len(comparisons):])])


# ---------------------------------------------------------------------------------------------- report


def plot_gain_retained(results: StressResults, path: Path) -> Path:
    """Gain retained per merge method (bars), one group of bars per trainer/ε (and noise level)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    groups, merges = results.groups(), list(results.grid.merges)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(groups) * len(merges) / 4), 3.8))
    width = 0.8 / len(merges)
    for i, method in enumerate(merges):
        values = [results.gain(g, method) for g in groups]
        ax.bar(np.arange(len(groups)) + i * width, [statistics.fmean(v) if v else 0.0 for v in values], width,
               yerr=[statistics.stdev(v) if len(v) > 1 else 0.0 for v in values], label=method, capsize=2)
    ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2, [label(g) for g in groups], fontsize=7, rotation=20)
    ax.set_ylabel("gain retained (%)")
    ax.axhline(100, color="grey", linestyle="--", linewidth=0.8)
    ax.legend(fontsize=7, ncol=4, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_stress_report(store: Store, grid: Grid, cells: Sequence[Cell], settings: Settings, report_dir: Path,
                        command: str, dp_recipe: Sequence[str], trainer_flags: dict[str, list[str]]) -> Path:
    """Write ``<report_dir>/BENCHMARKS_STRESS.md`` and its plot from the stored results of ``cells``."""
    results = StressResults(store, grid, cells, settings)
    groups, merges = results.groups(), list(grid.merges)
    out = [
        "# Stress benchmark",
        "",
        f"Generated by `python -m benchmarks.quality` on {datetime.date.today().isoformat()} from the stored results "
        f"of {len(cells)} cells; do not edit by hand. Reproduce with:",
        "",
        f"```bash\n{command}\n```",
        "",
        f"Wall time of the stored units: {results.seconds() / 60:.0f} min.",
    ]
    if results.missing:
        out += ["", f"**Incomplete:** {len(results.missing)} units have no result made with the current settings "
                f"(e.g. {', '.join(results.missing[:3])}); rerun the command to finish them."]
    out += [
        "",
        "## Grid",
        "",
        f"- Tasks ({len(grid.tasks)}): {', '.join(grid.tasks)}; trainers: {', '.join(grid.trainers)}; "
        f"ε ∈ {{{', '.join(f'{e:g}' for e in grid.epsilons)}}}; merges: {', '.join(merges)}.",
        f"- Floor: `{FLOOR_TRAINER}` (LoRA frozen, the task head alone; under DP an accounted release at the "
        "cell's ε).",
        f"- Noise arm: σ ∈ {{{', '.join(f'{s:g}' for s in grid.stress.noise_levels)}}} added to the non-private "
        "adapters' LoRA factors; cauchy_poe and dp_aware are given the true per-tensor noise.",
        f"- Test subsets: {'full' if grid.max_eval_samples is None else f'≤ {grid.max_eval_samples}'} examples per "
        f"task; tuning on ≤ {grid.stress.validation_samples} validation examples per task.",
        f"- Reductions against stress-full: {grid.reductions}.",
        f"- `DP_RECIPE`: `{' '.join(dp_recipe)}`; grid flags: `{' '.join(grid.train_flags)}`",
        *(f"- {name}: `{' '.join(flags)}`" for name, flags in trainer_flags.items() if name in grid.trainers),
        f"- {FLOOR_TRAINER} without ε (the non-private floor) adds `{' '.join(NON_PRIVATE_FLOOR_FLAGS)}`.",
        "",
        "### How every merge was tuned",
        "",
        f"Each method has the same budget of {BUDGET} points, and methods on the same λ scale the same λ grid; "
        "per cell the point with the best mean validation accuracy is chosen and only that merge is scored on "
        "test. Spaces:",
        "",
        table(["method", "scale", "points", "fixed"],
               [[m, SCALE.get(m, "–"), "; ".join(point_label(p) for p in SPACES[m]),
                 point_label(FIXED[m]) if m in FIXED else "–"] for m in merges]),
    ]
    rows, margins, entries = which_method_when(results)
    comparisons, margins = one_family(headline_comparisons(results), margins)
    rows = fill_margins(rows, margins)
    out += ["", "## Targets", "", *targets(comparisons, rows)]

    floor_row = [mean_sd([100 * statistics.fmean(f.values())]) if (f := results.floor_accuracy(g)) else "–"
                 for g in groups]
    out += ["", "## Merged accuracy (%) on test", "",
            "Each merge at its validation-chosen point; individual = each task's own adapter; floor = base encoder "
            "+ own head.", "",
            table(["adapters", "n", "floor", "individual", *merges],
                   [[label(g), str(len(results.individual.get(g, {}))), floor_row[i],
                     mean_sd(results.per_seed_mean(results.individual_accuracy(g))),
                     *(mean_sd(results.per_seed_mean(results.merged_accuracy(g, m))) for m in merges)]
                    for i, g in enumerate(groups)])]
    out += ["", "## Gain retained (%) = (merged − floor) / (individual − floor)", "",
            "On task-averaged test accuracies, per seed. \"below floor\": the adapters themselves do not beat the "
            "floor, so there is no gain to retain.", "",
            table(["adapters", *merges], [[label(g), *(("below floor" if results.below_floor(g) else
                                                          mean_sd(results.gain(g, m))) for m in merges)]
                                           for g in groups])]
    chosen = [(m, r["point"]) for g in groups for m in merges for r in results.tuned.get(g, {}).get(m, {}).values()]
    edges = sorted({m for m, point in chosen if grid_edges(m, point)})
    at_edge = sum(bool(grid_edges(m, point)) for m, point in chosen)
    out += ["", "## Selected hyper-parameters (per seed, chosen on validation)", "",
            "**(edge)**: the choice is the smallest or largest value of its grid axis, so the optimum may lie "
            "outside the grid; " + (f"{at_edge} of {len(chosen)} choices are at an edge ({', '.join(edges)})."
                                    if edges else "no choice is."), "",
            table(["adapters", *merges],
                   [[label(g), *(" / ".join(_choice(m, r["point"]) for _, r in sorted(
                       results.tuned.get(g, {}).get(m, {}).items())) or "–" for m in merges)] for g in groups])]
    out += ["", "## Significance of the headline comparisons", "",
            "Paired (both models on the same test examples of each seed and task). Seeds are the unit: the test "
            "is the paired t-test on the seeds' task-averaged accuracies (one seed: exact McNemar on its "
            "examples); the CI is a cluster bootstrap that resamples seeds, then examples within each seed. "
            + ("Every seed was scored on the same fixed test subset, so the distinct examples are those of one "
               "seed. " if not results.grid.stress.seed_test_subsets else
               "Each seed was scored on its own seeded stratified test subset. ")
            + f"Significant = Holm-adjusted p < {ALPHA:g} over the family of every comparison this report states "
            "(these and the margins of \"Which method when\"; a pair stated twice counts once).", ""]
    out += [f"- {title}: {_describe(c)}" for title, c in comparisons] or ["- not measured in this grid"]
    out += ["", "## Which method when", "",
            "Drawn from the measured results: per privacy level, the trainer and merge with the best validation "
            "mean, the floor (LoRA frozen, each task's head on the shared base encoder: nothing to merge) included "
            "as a candidate; interference = individual − merged (test, points); the margin is the paired test "
            "difference to the runner-up merge of the same adapters (for the floor: to the best merge).", "",
            table(["setting", "tasks", "interference", "trainer", "merge", "merged accuracy", "margin"], rows)
            if rows else "Not measured yet."]
    plots = report_dir / "benchmarks" / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    if any(results.gain(g, m) for g in groups for m in merges):
        path = plot_gain_retained(results, plots / "stress_gain_retained.png")
        out += ["", f"![gain retained per merge]({path.relative_to(report_dir).as_posix()})"]
    path = report_dir / REPORT_NAME
    path.write_text("\n".join(out) + "\n")
    found = evidence(entries, margins, REPORT_NAME, f"{', '.join(grid.tasks)}; {grid.reductions}")
    (report_dir / EVIDENCE_NAME).write_text(json.dumps(found, indent=1, allow_nan=True) + "\n")
    return path
