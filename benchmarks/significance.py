"""Paired significance of one model against another over a design of seeds × examples.

Both models are scored per seed on that seed's test examples, per task: 0/1 per example, keyed (seed, task).
The compared quantity is the mean over seeds of the seed's task-averaged accuracy difference, as the headline
tables average tasks, then seeds. Seeds are the unit of replication (each retrains the adapters and redraws the
merges); a seed's examples are a sample within it. With a fixed test subset every seed reuses the same
examples, so the examples behind a comparison are the distinct ones, never examples × seeds.

- Confidence interval: a two-level (cluster) bootstrap (Davison & Hinkley 1997, §3.8; Field & Welsh 2007):
  resample seeds with replacement, then each drawn seed's examples within each task (the same indices for both
  models); the percentile interval of the resampled mean difference. It carries the seed-to-seed variance an
  example-only bootstrap ignores; with one seed it is the paired example bootstrap.
- Test: with ≥ 2 seeds, the paired t-test on the seed-level accuracies (``scipy.stats.ttest_rel``); with one
  seed, exact McNemar on its examples (McNemar 1947; ``scipy.stats.binomtest`` of b first-only among b + c
  discordant pairs, p = ½).
- A mean over seeds: its t confidence interval (:func:`t_interval`), the seed being the unit.
- Multiplicity: Holm's step-down correction (Holm 1979) over a report's family of comparisons; a difference is
  **significant** when its Holm-adjusted p < :data:`ALPHA`.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats

ALPHA = 0.05
Key = tuple[int, str]  # (seed, task)


def mcnemar_p_value(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value for ``b`` and ``c`` discordant pairs: binomtest(b, b + c, ½)."""
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be ≥ 0, got b={b}, c={c}")
    return 1.0 if b + c == 0 else float(stats.binomtest(b, b + c, 0.5).pvalue)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values: sorted p₍₁₎ ≤ … ≤ p₍ₘ₎, p̃₍ᵢ₎ = max_{j ≤ i} min(1, (m − j + 1)·p₍ⱼ₎)."""
    order = np.argsort(p_values, kind="stable")
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * float(p_values[index])))
        adjusted[index] = running
    return adjusted


def paired_p(first: Sequence[float], second: Sequence[float], alternative: str = "two-sided") -> float | None:
    """Paired t-test over seeds (``ttest_rel``); None with fewer than 2 pairs or one difference throughout."""
    diffs = [a - b for a, b in zip(first, second)]
    return float(stats.ttest_rel(first, second, alternative=alternative).pvalue) if len(set(diffs)) > 1 else None


def holm_adjusted(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm-adjusted p-values over the tested comparisons (None: untested, left out of the family)."""
    tested = [i for i, p in enumerate(p_values) if p is not None]
    adjusted = dict(zip(tested, holm([p_values[i] for i in tested])))
    return [adjusted.get(i) for i in range(len(p_values))]


def p_cells(p: float | None, adjusted: float | None) -> list[str]:
    """The cells ``p`` and ``Holm-adjusted p`` (``*`` below :data:`ALPHA`); ``—`` for an untested comparison."""
    return ["—", "—"] if p is None or adjusted is None else [
        f"{p:.3g}", f"{adjusted:.3g}" + (" *" if adjusted < ALPHA else "")]


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """The two-sided ``level`` t confidence interval of the mean of ``values`` (one per seed, the unit):
    mean ± t_{(1 + level)/2, n − 1}·s/√n; None for fewer than two values."""
    if len(values) < 2:
        return None
    mean, half = float(np.mean(values)), float(stats.t.ppf((1 + level) / 2, len(values) - 1)
                                                * np.std(values, ddof=1) / np.sqrt(len(values)))
    return mean - half, mean + half


def _by_seed(first: Mapping[Key, np.ndarray], second: Mapping[Key, np.ndarray]
             ) -> dict[int, list[tuple[np.ndarray, np.ndarray]]]:
    """Per seed, the (first, second) 0/1 vectors of each task; both models must cover the same strata."""
    if set(first) != set(second) or not first:
        raise ValueError(f"the two models were scored on different strata: {sorted(map(str, first))} vs "
                         f"{sorted(map(str, second))}")
    seeds: dict[int, list[tuple[np.ndarray, np.ndarray]]] = defaultdict(list)
    for key in sorted(first, key=str):
        a, b = np.asarray(first[key], dtype=float), np.asarray(second[key], dtype=float)
        if a.shape != b.shape or a.ndim != 1 or not len(a):
            raise ValueError(f"stratum {key}: per-example scores must be two non-empty vectors of one length, "
                             f"got {a.shape} and {b.shape}")
        seeds[key[0]].append((a, b))
    tasks = {len(pairs) for pairs in seeds.values()}
    if len(tasks) != 1:
        raise ValueError(f"every seed must cover the same tasks, got {sorted(tasks)} tasks per seed")
    return dict(seeds)


def seed_accuracies(first: Mapping[Key, np.ndarray], second: Mapping[Key, np.ndarray]
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Per seed (sorted), each model's accuracy averaged over tasks."""
    seeds = _by_seed(first, second)
    return (np.array([np.mean([a.mean() for a, _ in seeds[s]]) for s in sorted(seeds)]),
            np.array([np.mean([b.mean() for _, b in seeds[s]]) for s in sorted(seeds)]))


def cluster_bootstrap_ci(first: Mapping[Key, np.ndarray], second: Mapping[Key, np.ndarray], *,
                         resamples: int = 2000, level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """(mean difference first − second, CI low, CI high) by the two-level bootstrap: seeds with replacement,
    then examples within each drawn seed and task (paired)."""
    seeds = _by_seed(first, second)
    names = sorted(seeds)
    rng = np.random.default_rng(seed)
    observed = float(np.mean([np.mean([a.mean() - b.mean() for a, b in seeds[s]]) for s in names]))
    # inner[s][r, k]: seed s's task-averaged difference under an independent example resample, for draw k of r
    inner = np.zeros((len(names), resamples, len(names)))
    for i, s in enumerate(names):
        for a, b in seeds[s]:
            difference = a - b
            draws = rng.integers(0, len(difference), size=(resamples * len(names), len(difference)))
            inner[i] += difference[draws].mean(axis=1).reshape(resamples, len(names))
        inner[i] /= len(seeds[s])
    picked = rng.integers(0, len(names), size=(resamples, len(names)))
    totals = inner[picked, np.arange(resamples)[:, None], np.arange(len(names))[None, :]].mean(axis=1)
    low, high = np.quantile(totals, [(1 - level) / 2, (1 + level) / 2])
    return observed, float(low), float(high)


@dataclass(frozen=True)
class Comparison:
    """A paired comparison, in accuracy points (first − second). ``p_adjusted`` is Holm's over the report's
    family (:func:`adjust`); until then it is the raw p."""

    first: str
    second: str
    difference: float
    ci_low: float
    ci_high: float
    test: str  # "paired t on seed means" | "exact McNemar"
    p_value: float
    seeds: int
    distinct_examples: int  # distinct test examples behind the comparison (over tasks; seeds sharing one count once)
    first_only: int  # b: example scores the first gets right and the second wrong (over seeds)
    second_only: int  # c
    seed_differences: tuple[float, ...]  # per seed, in points
    p_adjusted: float
    family: int = 1

    @property
    def significant(self) -> bool:
        return self.p_adjusted < ALPHA

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "significant": self.significant}


def distinct_examples(keys: Sequence[Key], lengths: Mapping[Key, int],
                      example_ids: Mapping[Key, Sequence[int]] | None) -> int:
    """The number of distinct test examples over ``keys``: per task, the union of its seeds' example ids
    (``example_ids`` None: every seed scored the same fixed subset, so a task counts its length once)."""
    per_task: dict[str, set] = defaultdict(set)
    for key in keys:
        ids = range(lengths[key]) if example_ids is None else example_ids[key]
        per_task[key[1]].update(int(i) for i in ids)
    return sum(len(ids) for ids in per_task.values())


def compare(first_name: str, first: Mapping[Key, np.ndarray], second_name: str, second: Mapping[Key, np.ndarray],
            *, example_ids: Mapping[Key, Sequence[int]] | None = None, resamples: int = 2000,
            seed: int = 0) -> Comparison:
    """Cluster bootstrap CI and the seed-level paired t-test (one seed: exact McNemar) of ``first`` against
    ``second`` (per-example 0/1 per (seed, task))."""
    difference, low, high = cluster_bootstrap_ci(first, second, resamples=resamples, seed=seed)
    ours, theirs = seed_accuracies(first, second)
    b = int(sum(((np.asarray(first[k]) == 1) & (np.asarray(second[k]) == 0)).sum() for k in first))
    c = int(sum(((np.asarray(first[k]) == 0) & (np.asarray(second[k]) == 1)).sum() for k in first))
    if len(ours) >= 2 and np.ptp(ours - theirs) <= 1e-12:  # no seed variance: t = ±∞ (p = 0) or 0/0 (p = 1)
        test, p_value = "paired t on seed means", float(abs(np.mean(ours - theirs)) <= 1e-12)
    elif len(ours) >= 2:
        test, p_value = "paired t on seed means", float(stats.ttest_rel(ours, theirs).pvalue)
    else:
        test, p_value = "exact McNemar", mcnemar_p_value(b, c)
    lengths = {key: len(values) for key, values in first.items()}
    return Comparison(first_name, second_name, 100 * difference, 100 * low, 100 * high, test, p_value, len(ours),
                      distinct_examples(list(first), lengths, example_ids), b, c,
                      tuple(float(v) for v in 100 * (ours - theirs)), p_value)


def adjust(comparisons: Sequence[Comparison]) -> list[Comparison]:
    """The comparisons with their Holm-adjusted p over this family (same order)."""
    adjusted = holm([c.p_value for c in comparisons])
    return [dataclasses.replace(c, p_adjusted=p, family=len(comparisons)) for c, p in zip(comparisons, adjusted)]
