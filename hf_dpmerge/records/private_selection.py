"""Differentially private selection of one candidate by its utility: exponential mechanism, permute-and-flip.

Both are ε-DP for utilities u_k(D) of global sensitivity Δ = max_k max_{D~D'} |u_k(D) − u_k(D')|
(docs/design.md §13):

- **exponential mechanism** (McSherry & Talwar 2007): P(k) ∝ exp(ε·u_k / (2Δ)); sampled as report-noisy-max
  with Gumbel noise, argmax_k (u_k + G_k), G_k ~ Gumbel(0, 2Δ/ε), which has exactly that distribution.
- **permute-and-flip** (McKenna & Sheldon 2020): visit the candidates in a uniformly random order and stop at
  the first k whose coin with P(heads) = exp(ε·(u_k − max_j u_j) / (2Δ)) comes up heads (the best one always
  does). Never worse in expected utility than the exponential mechanism.

The utility of a merge is its validation accuracy averaged over T tasks on public denominators: each task t
has a stated validation size n_t (public, fixed before the data is read; ``--validation_size``), its
validation set D_t is subsampled uniformly at random to min(n_t, |D_t|) examples (one subsample shared by
every candidate), and u = (1/T)·Σ_t c_t / n_t, c_t the correct predictions on the subsample (examples missing
when |D_t| < n_t count as wrong). Then Δ = max_t 1/(T·n_t) and the selection is ε-DP under the addition, the
removal and the replacement of one validation example, each directly (docs/design.md §13 couples an
add/remove neighbour's subsample to a replace-one neighbour of a subsample). The private sizes |D_t| enter
neither Δ nor the denominators: with denominators |D_t|, removing one example of the smallest set also
rescales every utility, and the log-probability ratio grows to ≈ ε·T/2.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

MECHANISMS = ("exponential", "permute_and_flip")


DEFAULT_VALIDATION_SIZE = 500


def accuracy_sensitivity(validation_size: Sequence[int]) -> float:
    """Δ = max_t 1/(T·n_t) of the task-averaged accuracy with the PUBLIC validation sizes n_t (module docstring)."""
    if not validation_size or min(validation_size) < 1:
        raise ValueError(f"--validation_size must be at least 1 for every task, got {list(validation_size)}")
    return 1.0 / (len(validation_size) * min(validation_size))


def subsample_indices(size: int, validation_size: int, rng: np.random.Generator) -> np.ndarray:
    """min(n, size) distinct indices of ``range(size)``, sorted: each subset of that size equally likely."""
    return np.sort(rng.choice(size, size=min(validation_size, size), replace=False))


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
    if mechanism == "exponential":
        return int(np.argmax(scores + rng.gumbel(0.0, scale, size=len(scores))))
    if mechanism == "permute_and_flip":
        best = scores.max()
        for k in rng.permutation(len(scores)):
            if rng.random() < math.exp((scores[k] - best) / scale) or scores[k] == best:
                return int(k)
    raise ValueError(f"--mechanism must be one of {MECHANISMS}, got {mechanism!r}")
