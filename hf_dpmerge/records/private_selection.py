"""Differentially private selection of one candidate by its utility: exponential mechanism, permute-and-flip.

Both are ε-DP for utilities u_k(D) of global sensitivity Δ = max_k max_{D~D'} |u_k(D) − u_k(D')|
(docs/design.md §13):

- **exponential mechanism** (McSherry & Talwar 2007): P(k) ∝ exp(ε·u_k / (2Δ)); sampled as report-noisy-max
  with Gumbel noise, argmax_k (u_k + G_k), G_k ~ Gumbel(0, 2Δ/ε), which has exactly that distribution.
- **permute-and-flip** (McKenna & Sheldon 2020): visit the candidates in a uniformly random order and stop at
  the first k whose coin with P(heads) = exp(ε·(u_k − max_j u_j) / (2Δ)) comes up heads (the best one always
  does). Never worse in expected utility than the exponential mechanism.

The utility of a merge is its validation accuracy averaged over T tasks, each with its denominator fixed at
the public size n_t of the task's validation set: u = (1/T)·Σ_t c_t / n_t, c_t the number of correct
predictions. Adding, removing or replacing one validation example changes one c_t by at most 1, so
Δ = max_t 1 / (T·n_t) under add/remove and under replace-one alike (a recomputed denominator would make
add/remove's sensitivity 1/(n_t − 1) at the released size and unbounded over all sizes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

MECHANISMS = ("exponential", "permute_and_flip")


def accuracy_sensitivity(validation_sizes: Sequence[int]) -> float:
    """Δ = max_t 1/(T·n_t) of the task-averaged accuracy with public denominators n_t (module docstring)."""
    if not validation_sizes or min(validation_sizes) < 1:
        raise ValueError(f"every task needs at least one validation example, got sizes {list(validation_sizes)}")
    return 1.0 / (len(validation_sizes) * min(validation_sizes))


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
    if mechanism == "exponential":
        return int(np.argmax(scores + rng.gumbel(0.0, scale, size=len(scores))))
    if mechanism == "permute_and_flip":
        best = scores.max()
        for k in rng.permutation(len(scores)):
            if rng.random() < math.exp((scores[k] - best) / scale) or scores[k] == best:
                return int(k)
    raise ValueError(f"--mechanism must be one of {MECHANISMS}, got {mechanism!r}")
