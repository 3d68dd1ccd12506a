"""Data-free, noise-calibrated merge of DP task vectors (DESIGN-NOTES §6; post-processing, no privacy cost).

Per tensor, with task vectors τ_i = W_i − W_0 and the DP noise variance s_i² each carries (scalar or per
coordinate, from :mod:`~hf_dpmerge.merging.noise_variance`):

1. denoise: θ̂_i = SURE-optimal soft threshold of τ_i at noise level s_i
   (:func:`~hf_dpmerge.merging.sure_threshold.sure_soft_threshold`);
2. optional ``consensus="precision_sign"`` (noise-calibrated TIES election): per coordinate keep only the
   θ̂_i whose sign agrees with sign(Σ_i θ̂_i / s_i²);
3. combine: task arithmetic W_0 + λ·Σ_i w_i θ̂_i, or with ``weighting="random_effects"`` (adapters of the
   SAME task) the inverse-variance mean W_0 + λ·Σ_i c_i θ̂_i, c_i ∝ w_i/(s_i² + τ²), Σ_i c_i = 1, with
   the between-adapter variance τ² from the DerSimonian–Laird moment estimator on the raw τ_i.

With zero noise (and the defaults) every step is the identity and the result is exactly mergekit's
``task_arithmetic``: W_0 + λ·Σ_i w_i τ_i, computed in the same order and dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from hf_dpmerge.merging.sure_threshold import sure_soft_threshold

Consensus = Literal["none", "precision_sign"]
Weighting = Literal["task_arithmetic", "random_effects"]
_TINY = 1e-30


def between_variance(taus: torch.Tensor, variances: torch.Tensor) -> float:
    """DerSimonian–Laird τ² pooled over coordinates: max(0, (Q − df) / Σ_k (Σw − Σw²/Σw)), w = 1/s²."""
    weights = 1.0 / variances.double()
    total = weights.sum(dim=0)
    mean = (weights * taus.double()).sum(dim=0) / total
    q = (weights * (taus.double() - mean).square()).sum()
    df = mean.numel() * (taus.shape[0] - 1)
    scale = (total - weights.square().sum(dim=0) / total).sum()
    return max(0.0, float((q - df) / scale))


def _random_effects_coefficients(
    taus: torch.Tensor, variances: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    if not bool((variances > 0).any()):
        return weights / weights.sum(dim=0)
    if not bool((variances > 0).all()):
        raise ValueError("random_effects weighting needs DP noise in every input or in none")
    precision = weights / (variances + between_variance(taus, variances))
    return precision / precision.sum(dim=0)


def dp_aware_merge(
    base: torch.Tensor,
    finetuned: Sequence[torch.Tensor],
    variances: Sequence[torch.Tensor | float],
    *,
    weights: Sequence[float],
    lam: float,
    consensus: Consensus = "none",
    weighting: Weighting = "task_arithmetic",
) -> torch.Tensor:
    """Merge one tensor; ``variances[i]`` is s_i² of input i, a scalar or a tensor shaped like ``base``."""
    noisy = [bool(torch.as_tensor(v).gt(0).any()) for v in variances]
    if not any(noisy) and consensus == "none" and weighting == "task_arithmetic":
        deltas = torch.stack([tensor - base for tensor in finetuned])
        deltas.mul_(torch.tensor(weights, dtype=deltas.dtype).reshape(-1, *[1] * base.ndim))
        mixed = deltas.sum(dim=0)
        if lam != 1:
            mixed *= lam
        return (base + mixed).to(base.dtype)
    work = base.float()
    taus = torch.stack([tensor.float() - work for tensor in finetuned])
    var = torch.stack([torch.as_tensor(v, dtype=torch.float32).expand(base.shape) for v in variances])
    denoised = torch.stack([sure_soft_threshold(t, v) if n else t for t, v, n in zip(taus, var, noisy)])
    coefficient = torch.tensor(weights, dtype=torch.float32).reshape(-1, *[1] * base.ndim)
    if weighting == "random_effects":
        coefficient = _random_effects_coefficients(taus, var, coefficient.expand_as(taus))
    contribution = coefficient * denoised
    if consensus == "precision_sign":
        elected = torch.sign((denoised / (var + _TINY)).sum(dim=0))
        contribution = contribution * (torch.sign(denoised) == elected)
    return (work + lam * contribution.sum(dim=0)).to(base.dtype)
