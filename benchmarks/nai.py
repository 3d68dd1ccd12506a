"""What merges keep over seeds: per method and seed the task-averaged floor, individual and merged accuracy and NAI =
(merged − floor) / (individual − floor), 95 % t intervals over seeds (the seed is the unit: each retrains every
adapter), each method against task arithmetic (paired over seeds, Holm over the methods), and a private arm's
DP-induced drop against its non-private twin. Shared by the merge-gain studies of MiniLM
(``benchmarks/studies/merge_gain.py``) and SmolLM2 (``benchmarks/studies/causal_merge.py``)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from benchmarks.markdown import table
from benchmarks.merging import floor_average, gain_retained, task_average
from benchmarks.significance import ALPHA, holm_adjusted, p_cells, paired_p, t_interval

BASELINE = "task_arithmetic"


@dataclass(frozen=True)
class Scores:
    """One method's merges of one arm, per seed (sorted): task-averaged floor, individual, merged (%) and NAI,
    the per-task floor, individual, merged (%) and NAI, and the merge's wall seconds (NaN where not timed)."""

    seeds: list[int]
    floor: list[float]
    individual: list[float]
    merged: list[float]
    nai: list[float]
    task_floor: dict[str, list[float]]
    task_individual: dict[str, list[float]]
    task_merged: dict[str, list[float]]
    task_nai: dict[str, list[float]]
    seconds: list[float]

    def at(self, seeds: list[int], values: str) -> list[float]:
        return [getattr(self, values)[self.seeds.index(s)] for s in seeds]

    def common(self, other: Scores) -> list[int]:
        return sorted(set(self.seeds) & set(other.seeds))


def scores(units: list[dict], floors: dict[tuple[str, int], float]) -> Scores:
    """One method's merge units (settings | result, one per seed) on the seeds whose floors are all stored."""
    units = sorted((u for u in units if not math.isnan(floor_average(u, floors))), key=lambda u: u["seed"])
    floor = [floor_average(u, floors) for u in units]
    individual, merged = ([task_average(u, score) for u in units] for score in ("individual", "merged"))
    tasks = units[0]["tasks"] if units else []
    task_floor = {t: [floors[(t, u["seed"])] for u in units] for t in tasks}
    task_score = {score: {t: [100 * u["evaluation"]["tasks"][t][score] for u in units] for t in tasks}
                  for score in ("individual", "merged")}
    return Scores([u["seed"] for u in units], floor, individual, merged,
                  [gain_retained(*s) for s in zip(floor, individual, merged)], task_floor, task_score["individual"],
                  task_score["merged"],
                  {t: [gain_retained(*s) for s in zip(task_floor[t], task_score["individual"][t],
                                                      task_score["merged"][t])] for t in tasks},
                  [u.get("merge_seconds", math.nan) for u in units])


@dataclass(frozen=True)
class Versus:
    """A method against task arithmetic on the seeds both merged: merged − task arithmetic per seed (points), the
    paired t p-value and its Holm adjustment over the methods compared, NAI − task arithmetic's per seed, and the
    mean ratio of merge times (NaN where a merge was not timed)."""

    seeds: list[int]
    diffs: list[float]
    p: float | None
    adjusted: float | None
    nai_gaps: list[float]
    time_ratio: float


def against_baseline(found: dict[str, Scores]) -> dict[str, Versus]:
    baseline = found.get(BASELINE)
    if baseline is None:
        return {}
    seeds = {m: s.common(baseline) for m, s in found.items() if m != BASELINE and s.common(baseline)}
    merged = {m: (found[m].at(seeds[m], "merged"), baseline.at(seeds[m], "merged")) for m in seeds}
    p_values = [paired_p(*merged[m]) for m in seeds]
    return {m: Versus(seeds[m], [a - b for a, b in zip(*merged[m])], p, adjusted,
                      [a - b for a, b in zip(found[m].at(seeds[m], "nai"), baseline.at(seeds[m], "nai"))],
                      statistics.mean(a / b for a, b in zip(found[m].at(seeds[m], "seconds"),
                                                            baseline.at(seeds[m], "seconds"))))
            for m, p, adjusted in zip(seeds, p_values, holm_adjusted(p_values))}


def best_method(found: dict[str, Scores], candidates=None) -> str | None:
    """The method of the highest mean NAI among ``candidates`` (default: every method but task arithmetic), those
    with an undefined NAI left out; None when there is none."""
    nai = {m: defined_mean(found[m].nai) for m in (candidates if candidates is not None else found) if m != BASELINE}
    return max((m for m in nai if nai[m] is not None), key=nai.get, default=None)


def share_cell(values: list[float], unit: str = "%") -> str:
    """A mean over seeds of shares (NAI or its differences) in percent, with its 95 % t interval: ``57 % [41, 73]``;
    undefined when a seed's adapters do not beat the floor (NaN)."""
    if not values:
        return "—"
    if any(math.isnan(v) for v in values):
        return "— (individual ≤ floor)"
    interval = t_interval(values)
    return f"{100 * statistics.mean(values):.0f} {unit}" + (
        " (1 seed, no CI)" if interval is None else f" [{100 * interval[0]:.0f}, {100 * interval[1]:.0f}]")


def seeds_cell(seeds: list[int]) -> str:
    return ",".join(map(str, seeds))


def defined_mean(values: list[float]) -> float | None:
    return None if not values or any(math.isnan(v) for v in values) else statistics.mean(values)


def verdict(met: bool | None) -> str:
    return {True: "holds", False: "does not hold", None: "not yet measured"}[met]


def tables(found: dict[str, Scores], floor_note: str, twin: str | None = None,
           twin_found: dict[str, Scores] | None = None) -> list[str]:
    """Per method the task averages and NAI (``floor_note`` says what the floor and the scores are), NAI per task,
    each method against task arithmetic and, given a non-private ``twin`` name, the drop against its merges
    (``twin_found``). ``found``: methods with at least one seed."""
    rows = [[m, seeds_cell(s.seeds), *(f"{statistics.mean(v):.1f}" for v in (s.floor, s.individual, s.merged)),
             f"{statistics.mean(a - b for a, b in zip(s.merged, s.floor)):+.2f}", share_cell(s.nai)]
            for m, s in found.items()]
    first = next(iter(found))
    task_rows = [[t, f"{statistics.mean(found[first].task_floor[t]):.1f}",
                  f"{statistics.mean(found[first].task_individual[t]):.1f}",
                  *(share_cell(s.task_nai[t]) for s in found.values())] for t in found[first].task_nai]
    text = [f"{floor_note} Averaged over the tasks, means over seeds; NAI from each seed's task-averaged scores.", "",
            table(["method", "seeds", "floor", "individual", "merged", "merged − floor (points)", "NAI [95 % CI]"],
                  rows), "",
            "### NAI per task", "",
            f"Floor and individual: means over `{first}`'s seeds (every method merges the same adapters).", "",
            table(["task", "floor", "individual", *found], task_rows), ""]
    versus = against_baseline(found)
    if versus:
        text += ["### Against task arithmetic", "",
                 "Task-averaged merged accuracy, paired over seeds (points), Holm over the methods compared; merge "
                 "time (`hf-dpmerge merge`, LoRA cache built first) as a multiple of task arithmetic's on the same "
                 "adapters, mean over seeds.", "",
                 table(["method", "seeds", "merged − task arithmetic per seed", "mean", "p (paired t, seeds)",
                        f"Holm-adjusted p (* < {ALPHA})", "NAI − task arithmetic's", "merge time × task arithmetic"],
                       [[m, seeds_cell(v.seeds), " ".join(f"{d:+.2f}" for d in v.diffs),
                         f"{statistics.mean(v.diffs):+.2f}", *p_cells(v.p, v.adjusted),
                         share_cell(v.nai_gaps, "points"),
                         "—" if math.isnan(v.time_ratio) else f"{v.time_ratio:.1f}×"] for m, v in versus.items()]), ""]
    if twin is None:
        return text
    drops = [[m, seeds_cell(seeds), share_cell(s.at(seeds, "nai")), share_cell(twin_found[m].at(seeds, "nai")),
              share_cell([a - b for a, b in zip(twin_found[m].at(seeds, "nai"), s.at(seeds, "nai"))], "points")]
             for m, s in found.items() if twin_found and m in twin_found
             for seeds in [s.common(twin_found[m])] if seeds]
    return text + ["### DP-induced mergeability drop", "",
                   *([f"NAI of the non-private twin `{twin}` − this arm's, paired over seeds.", "",
                      table(["method", "seeds", "NAI", "twin's NAI", "drop [95 % CI]"], drops)] if drops else
                     [f"Not yet measured: the non-private twin (`{twin}`) has no stored merge of these methods and "
                      "seeds."]), ""]
