"""The studies' statistics over seeds, the unit of replication (each seed retrains the adapters): the paired t-test
of two arms' per-seed scores (:func:`paired_p`), the t confidence interval of a mean over seeds (:func:`t_interval`)
and Holm's step-down correction (Holm 1979) over a report's family of comparisons; a difference is **significant**
when its Holm-adjusted p < :data:`ALPHA`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats

ALPHA = 0.05


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
