"""Empirical ε lower bound from one training run (Steinke, Nasr & Jagielski, NeurIPS 2023, arXiv:2305.08846).

m canaries are each included with probability 1/2; the auditor makes r guesses fixed in advance, v of them
correct. For an (ε, δ)-DP training (their §5, Corollary 5.4 in arXiv v1, evaluated as in their App. D)

    P[V ≥ v] ≤ p(ε) = T(v) + 2mδ · max_{i=1..v} [T(v − i) − T(v)] / i,
    T(k) = P[Binomial(r, q) ≥ k],   q = e^ε / (1 + e^ε)

(δ = 0: the pure-DP bound T(v) of their §3), and ε_lo = sup{ε ≥ 0 : p(ε) ≤ β} is a lower bound on ε at
confidence 1 − β (0 when no ε is rejected). Choosing r after looking at the scores would need a correction.
See docs/design.md §11.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats
from scipy.special import expit

_GRID_POINTS = 400
_BISECTION_STEPS = 50


def _check_counts(num_canaries: int, num_guesses: int, num_correct: int, delta: float) -> None:
    if not 0 <= num_correct <= num_guesses <= num_canaries:
        raise ValueError(
            "need 0 ≤ correct guesses ≤ guesses ≤ canaries, got "
            f"{num_correct} ≤ {num_guesses} ≤ {num_canaries}"
        )
    if not (math.isfinite(delta) and 0 <= delta < 1):
        raise ValueError(f"delta must lie in [0, 1), got {delta}")


def _tail(k: int, r: int, epsilon: float) -> float:
    """T(k) = P[Binomial(r, e^ε/(1+e^ε)) ≥ k]."""
    return float(stats.binom.sf(k - 1, r, float(expit(epsilon))))


def audit_p_value(*, num_canaries: int, num_guesses: int, num_correct: int, epsilon: float, delta: float) -> float:
    """p(ε): the largest probability an (ε, δ)-DP training run gives of ≥ ``num_correct`` correct guesses."""
    _check_counts(num_canaries, num_guesses, num_correct, delta)
    if not epsilon >= 0:
        raise ValueError(f"epsilon must be ≥ 0, got {epsilon}")
    r, v = num_guesses, num_correct
    tail = _tail(v, r, epsilon)
    if delta == 0 or v == 0:
        return min(tail, 1.0)
    # window[i-1] = P[v − i ≤ Binomial(r, q) < v] = T(v − i) − T(v), for i = 1..v
    window = np.cumsum(stats.binom.pmf(np.arange(v - 1, -1, -1), r, float(expit(epsilon))))
    slack = float(np.max(window / np.arange(1, v + 1)))
    return min(tail + 2 * num_canaries * delta * slack, 1.0)


def _rejection_ceiling(
    num_canaries: int, num_guesses: int, num_correct: int, delta: float, beta: float
) -> float | None:
    """An ε beyond which p(ε) > β for good (via the monotone g_⌈c⌉ ≤ p), or None when p ≡ 1."""
    # (ε, δ)-DP implies (ε', δ)-DP for every ε' ≥ ε, so the rejected ε form an interval [0, ε_lo]. With c = 2mδ,
    # p(ε) = max_i g_i(ε), g_i = T(v)(1 − c/i) + c·T(v − i)/i; both tails grow with q, so g_i is non-decreasing for
    # i ≥ c: past the first ε where g_⌈c⌉ > β nothing is rejected (and c ≥ v rejects nothing at all).
    c = 2 * num_canaries * delta
    if num_correct == 0 or c >= num_correct:
        return None
    i = max(1, math.ceil(c))
    r, v = num_guesses, num_correct

    def minorant(epsilon: float) -> float:
        return _tail(v, r, epsilon) * (1 - c / i) + c / i * _tail(v - i, r, epsilon)

    ceiling = 1.0
    while minorant(ceiling) <= beta:
        ceiling *= 2
    return ceiling


def epsilon_lower_bound(
    *, num_canaries: int, num_guesses: int, num_correct: int, delta: float, confidence: float
) -> float:
    """ε_lo = sup{ε ≥ 0 : p(ε) ≤ 1 − confidence}; 0 when no ε is rejected."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    _check_counts(num_canaries, num_guesses, num_correct, delta)
    beta = 1 - confidence

    def rejected(epsilon: float) -> bool:
        return audit_p_value(
            num_canaries=num_canaries, num_guesses=num_guesses, num_correct=num_correct,
            epsilon=epsilon, delta=delta,
        ) <= beta

    ceiling = _rejection_ceiling(num_canaries, num_guesses, num_correct, delta, beta)
    if ceiling is None:
        return 0.0
    # grid, then bisection, always reporting a rejected ε: when 2mδ ≤ 1, p is monotone and this is exactly ε_lo;
    # otherwise a dip between grid points could only make the reported bound smaller, never invalid
    grid = np.linspace(0.0, ceiling, _GRID_POINTS + 1)
    hits = [index for index, epsilon in enumerate(grid) if rejected(float(epsilon))]
    if not hits:
        return 0.0
    low, high = float(grid[hits[-1]]), float(grid[hits[-1] + 1])  # p(ceiling) > β, so hits[-1] < last
    for _ in range(_BISECTION_STEPS):
        middle = (low + high) / 2
        if rejected(middle):
            low = middle
        else:
            high = middle
    return low
