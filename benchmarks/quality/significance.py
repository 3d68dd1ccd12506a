"""Paired significance of one model against another on the same test examples (the stress grid's comparisons).

Both models are scored on the same examples, so the comparison is paired: per example, correct (1) or not (0).
Examples come in strata (one per task and seed); the compared quantity is the unweighted mean over strata of
the per-stratum accuracy difference, as the headline tables average tasks (and seeds).

- paired bootstrap (Efron & Tibshirani 1993; Koehn 2004, paired bootstrap resampling of a test set): resample
  the examples of each stratum with replacement, the same indices for both models; the percentile interval of
  the resampled mean difference is the CI.
- McNemar's test (McNemar 1947) over the pooled discordant pairs: b = first right and second wrong, c = the
  reverse. Exact two-sided binomial p = min(1, 2·P[X ≤ min(b, c)]), X ~ Bin(b + c, ½), when b + c < :data:`EXACT_BELOW`;
  otherwise the χ² statistic with continuity correction (|b − c| − 1)²/(b + c) on 1 degree of freedom.

A difference is called significant when the CI excludes 0 and McNemar's p < α (both at α = 0.05).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

EXACT_BELOW = 25
ALPHA = 0.05


def mcnemar_p_value(b: int, c: int) -> float:
    """Two-sided McNemar p-value for ``b`` and ``c`` discordant pairs (exact binomial below :data:`EXACT_BELOW`)."""
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be ≥ 0, got b={b}, c={c}")
    n = b + c
    if n == 0:
        return 1.0
    if n < EXACT_BELOW:
        tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2**n
        return min(1.0, 2 * tail)
    statistic = (abs(b - c) - 1) ** 2 / n
    return math.erfc(math.sqrt(statistic / 2))  # survival function of χ²(1)


def _paired_strata(first: Mapping[Any, np.ndarray],
                   second: Mapping[Any, np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    if set(first) != set(second) or not first:
        raise ValueError(f"the two models were scored on different strata: {sorted(map(str, first))} vs "
                         f"{sorted(map(str, second))}")
    pairs = []
    for key in first:
        a, b = np.asarray(first[key], dtype=float), np.asarray(second[key], dtype=float)
        if a.shape != b.shape or a.ndim != 1 or not len(a):
            raise ValueError(f"stratum {key}: per-example scores must be two non-empty vectors of one length, "
                             f"got {a.shape} and {b.shape}")
        pairs.append((a, b))
    return pairs


def paired_bootstrap_ci(first: Mapping[Any, np.ndarray], second: Mapping[Any, np.ndarray], *, resamples: int = 2000,
                        level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """(mean difference first − second, CI low, CI high): the mean over strata of the per-stratum accuracy
    difference, and its percentile bootstrap interval from resampling each stratum's examples (paired)."""
    pairs = _paired_strata(first, second)
    rng = np.random.default_rng(seed)
    observed = float(np.mean([a.mean() - b.mean() for a, b in pairs]))
    totals = np.zeros(resamples)
    for a, b in pairs:
        difference = a - b
        draws = rng.integers(0, len(difference), size=(resamples, len(difference)))
        totals += difference[draws].mean(axis=1)
    low, high = np.quantile(totals / len(pairs), [(1 - level) / 2, (1 + level) / 2])
    return observed, float(low), float(high)


@dataclass(frozen=True)
class Comparison:
    """A paired comparison, in accuracy points (first − second)."""

    first: str
    second: str
    difference: float
    ci_low: float
    ci_high: float
    first_only: int  # b: examples the first gets right and the second wrong
    second_only: int  # c
    p_value: float
    examples: int

    @property
    def significant(self) -> bool:
        return self.p_value < ALPHA and (self.ci_low > 0 or self.ci_high < 0)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "significant": self.significant}


def compare(first_name: str, first: Mapping[Any, np.ndarray], second_name: str, second: Mapping[Any, np.ndarray],
            *, resamples: int = 2000, seed: int = 0) -> Comparison:
    """Paired bootstrap CI and McNemar's test of ``first`` against ``second`` (per-example 0/1 per stratum)."""
    difference, low, high = paired_bootstrap_ci(first, second, resamples=resamples, seed=seed)
    pairs = _paired_strata(first, second)
    b = int(sum(((a == 1) & (c == 0)).sum() for a, c in pairs))
    c = int(sum(((a == 0) & (c == 1)).sum() for a, c in pairs))
    return Comparison(first_name, second_name, 100 * difference, 100 * low, 100 * high, b, c, mcnemar_p_value(b, c),
                      sum(len(a) for a, _ in pairs))
