"""Differentially private selection of one candidate by its utility: exponential mechanism, permute-and-flip.

Both are ε-DP for utilities of global sensitivity Δ: the **exponential mechanism** (McSherry & Talwar 2007),
P(k) ∝ exp(ε·u_k / (2Δ)), sampled as argmax_k (u_k + G_k), G_k ~ Gumbel(0, 2Δ/ε); **permute-and-flip** (McKenna &
Sheldon, NeurIPS 2020, arXiv:2010.12603), the first k in a random order whose coin with
P(heads) = exp(ε·(u_k − max_j u_j) / (2Δ)) comes up heads, never worse in expected utility. A merge's utility is
u = (1/T)·Σ_t c_t / n_t on PUBLIC validation sizes n_t (each set subsampled to n_t; missing examples count as
wrong), so Δ = max_t m_t/(T·n_t), with m_t = 1 per example and, for a user-level task, the public cap m on each
unit's scored rows (:func:`unit_capped_indices`); ε-DP under addition, removal and replacement of one example (or
unit). The private sizes |D_t| enter neither Δ nor the denominators. See docs/design.md §13.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence

import numpy as np

MECHANISMS = ("exponential", "permute_and_flip")


DEFAULT_VALIDATION_SIZE = 500


def accuracy_sensitivity(validation_size: Sequence[int], rows_per_unit: Sequence[int] | None = None) -> float:
    """Δ = max_t m_t/(T·n_t) of the task-averaged accuracy with the PUBLIC validation sizes n_t and the most scored
    rows m_t one privacy unit of task t can hold (default 1: one row is the unit; module docstring)."""
    if not validation_size or min(validation_size) < 1:
        raise ValueError(f"--validation_size must be at least 1 for every task, got {list(validation_size)}")
    rows = [1] * len(validation_size) if rows_per_unit is None else list(rows_per_unit)
    if len(rows) != len(validation_size) or min(rows) < 1:
        raise ValueError(f"--rows_per_unit must be at least 1 for every task, got {rows}")
    return max(m / (len(validation_size) * n) for m, n in zip(rows, validation_size, strict=True))


def subsample_indices(size: int, validation_size: int, rng: np.random.Generator) -> np.ndarray:
    """min(n, size) distinct indices of ``range(size)``, sorted: each subset of that size equally likely."""
    return np.sort(rng.choice(size, size=min(validation_size, size), replace=False))


def unit_capped_indices(units: Sequence[Hashable], rows_per_unit: int, validation_size: int, keys: np.ndarray
                        ) -> np.ndarray:
    """The rows scored when a row's ``units`` value is its privacy unit, sorted: every row has a key (i.i.d. uniform
    ``keys``); each unit keeps its ``rows_per_unit`` rows of smallest key and the ``validation_size`` kept rows of
    smallest key are scored. Given the other units' keys, one unit's rows change at most ``rows_per_unit`` of the
    scored rows (docs/design.md §13)."""
    kept: list[int] = []
    per_unit: dict[Hashable, int] = {}
    for row in np.argsort(keys, kind="stable"):
        if len(kept) == validation_size:
            break
        if per_unit.get(units[row], 0) < rows_per_unit:
            per_unit[units[row]] = per_unit.get(units[row], 0) + 1
            kept.append(int(row))
    return np.sort(np.asarray(kept, dtype=int))


def task_averaged_accuracy(counts: Mapping[str, int], validation_size: Mapping[str, int]) -> float:
    """u = (1/T)·Σ_t c_t / n_t on the denominators ``validation_size`` (module docstring)."""
    return float(np.mean([counts[task] / validation_size[task] for task in validation_size]))


def selection_probabilities(utilities: Sequence[float], epsilon: float, sensitivity: float) -> np.ndarray:
    """The exponential mechanism's P(k) = softmax(ε·u / (2Δ))."""
    logits = epsilon * np.asarray(utilities, dtype=float) / (2 * sensitivity)
    weights = np.exp(logits - logits.max())
    return weights / weights.sum()


def select_private(
    utilities: Sequence[float], epsilon: float, sensitivity: float, mechanism: str, rng: np.random.Generator
) -> int:
    """The index chosen by ``mechanism`` (one of :data:`MECHANISMS`); ε-DP for utilities of sensitivity Δ."""
    if not utilities or not all(math.isfinite(u) for u in utilities):
        raise ValueError(f"utilities must be a non-empty list of finite numbers, got {list(utilities)}")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"--epsilon must be a positive finite number, got {epsilon}")
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ValueError(f"sensitivity must be positive and finite, got {sensitivity}")
    scores = np.asarray(utilities, dtype=float)
    scale = 2 * sensitivity / epsilon
    if mechanism == "exponential":  # report-noisy-max with Gumbel(2Δ/ε) noise has exactly P(k) ∝ exp(ε·u_k/(2Δ))
        return int(np.argmax(scores + rng.gumbel(0.0, scale, size=len(scores))))
    if mechanism == "permute_and_flip":
        best = scores.max()
        for k in rng.permutation(len(scores)):
            if rng.random() < math.exp((scores[k] - best) / scale) or scores[k] == best:  # the best always heads
                return int(k)
    raise ValueError(f"--mechanism must be one of {MECHANISMS}, got {mechanism!r}")
