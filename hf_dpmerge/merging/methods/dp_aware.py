"""Data-free, noise-calibrated merge of DP task vectors (docs/design.md §6; post-processing, no privacy cost).

Per tensor, with task vectors τ_i = W_i − W_0 and the DP noise variance s_i² each carries
(:mod:`~hf_dpmerge.noise.variance`): (1) denoise, ``shrinkage="scale"`` (default) the SURE-optimal
positive-part James–Stein scale θ̂_i = max(0, 1 − Σ_k s_ik²/‖τ_i‖²)·τ_i, or ``soft_threshold`` at s_i (a LoRA
delta in factor space: θ̂_i = s·SURE(B; V_B)·A); (2) optional ``consensus="precision_sign"``: keep the θ̂_i whose
sign agrees with sign(Σ_i θ̂_i / s_i²); (3) combine W_0 + λ·Σ_i w_i θ̂_i, or with ``weighting="random_effects"``
(adapters of one task) W_0 + λ·Σ_i c_i θ̂_i, c_i ∝ w_i/(s_i² + τ²), τ² by DerSimonian–Laird. With zero noise
and the defaults the result is exactly mergekit's ``task_arithmetic``, in the same order and dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from hf_dpmerge.noise.shrinkage import sure_scale
from hf_dpmerge.noise.sure_threshold import sure_soft_threshold

Consensus = Literal["none", "precision_sign"]
Weighting = Literal["task_arithmetic", "random_effects"]
Shrinkage = Literal["scale", "soft_threshold"]
SHRINKERS = {"scale": sure_scale, "soft_threshold": sure_soft_threshold}
_TINY = 1e-30


def between_variance(taus: Sequence[torch.Tensor], variances: Sequence[torch.Tensor]) -> float:
    """DerSimonian–Laird τ² pooled over coordinates: max(0, (Q − df) / Σ_k (Σw − Σw²/Σw)), w = 1/s²."""
    weights = [1.0 / v.double() for v in variances]
    total = sum(weights)
    mean = sum(w * t.double() for w, t in zip(weights, taus)) / total
    q = sum(float((w * (t.double() - mean).square()).sum()) for w, t in zip(weights, taus))
    df = mean.numel() * (len(taus) - 1)
    scale = (total - sum(w.square() for w in weights) / total).expand(mean.shape).sum()
    return max(0.0, (q - df) / float(scale))


def _random_effects_coefficients(
    taus: Sequence[torch.Tensor], variances: Sequence[torch.Tensor], weights: Sequence[float]
) -> list[torch.Tensor]:
    noisy = [bool((v > 0).any()) for v in variances]
    if not any(noisy):
        return [torch.tensor(w / sum(weights)) for w in weights]
    if not all(bool((v > 0).all()) for v in variances):
        raise ValueError("random_effects weighting needs DP noise in every input or in none")
    spread = between_variance(taus, variances)
    precision = [w / (v + spread) for w, v in zip(weights, variances)]
    total = sum(precision)
    return [p / total for p in precision]


def lora_factor_estimate(
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scaling: float,
    variance_b: torch.Tensor | float,
    fan_in_fan_out: bool = False,
) -> torch.Tensor:
    """θ̂ = s·B̂·A with B̂ the SURE soft threshold of B at its per-entry noise variance V_B.

    B is zero at initialisation (peft's default), so it holds only what training moved, with independent
    noise per entry; A keeps its dense random initialisation, which a threshold would only bias, and its
    noise enters θ̂ through B̂ (small where B̂ is). In the weight's layout (transposed when ``fan_in_fan_out``).
    """
    denoised = sure_soft_threshold(lora_b.float(), variance_b)
    delta = scaling * (denoised @ lora_a.float())
    return delta.T if fan_in_fan_out else delta


def dp_aware_merge(
    base: torch.Tensor,
    finetuned: Sequence[torch.Tensor],
    variances: Sequence[torch.Tensor | float],
    *,
    weights: Sequence[float],
    lam: float,
    consensus: Consensus = "none",
    weighting: Weighting = "task_arithmetic",
    denoised: Sequence[torch.Tensor | None] | None = None,
    shrinkage: Shrinkage = "scale",
) -> torch.Tensor:
    """Merge one tensor; ``variances[i]`` is s_i² of input i, a scalar or a tensor shaped like ``base``.

    ``denoised[i]``, when given, is input i's denoised task vector computed elsewhere (LoRA factor space),
    used instead of shrinking the dense τ_i. Every map is moved to ``base``'s device.
    """
    variances = [torch.as_tensor(v, dtype=torch.float32).to(base.device) for v in variances]
    noisy = [bool((v > 0).any()) for v in variances]
    if not any(noisy) and consensus == "none" and weighting == "task_arithmetic":
        deltas = torch.stack([tensor - base for tensor in finetuned])
        deltas.mul_(torch.tensor(weights, dtype=deltas.dtype).reshape(-1, *[1] * base.ndim))
        mixed = deltas.sum(dim=0)
        if lam != 1:
            mixed *= lam
        return (base + mixed).to(base.dtype)
    work = base.float()

    def estimate(index: int) -> torch.Tensor:
        if denoised is not None and denoised[index] is not None and noisy[index]:
            return denoised[index].to(device=work.device, dtype=work.dtype)
        tau = finetuned[index].float() - work
        return SHRINKERS[shrinkage](tau, variances[index]) if noisy[index] else tau

    if weighting == "random_effects":
        taus = [tensor.float() - work for tensor in finetuned]
        coefficients = _random_effects_coefficients(taus, variances, weights)
        del taus
    else:
        coefficients = [torch.tensor(weight) for weight in weights]
    # the election needs every estimate at once; otherwise one at a time keeps memory flat
    estimates = [estimate(i) for i in range(len(finetuned))] if consensus == "precision_sign" else None
    elected = None
    if estimates is not None:
        elected = torch.sign(sum(e / (v + _TINY) for e, v in zip(estimates, variances)))
    merged = torch.zeros_like(work)
    for index, coefficient in enumerate(coefficients):
        value = estimates[index] if estimates is not None else estimate(index)
        contribution = coefficient * value
        if elected is not None:
            contribution *= torch.sign(value) == elected
        merged += contribution
    return torch.add(work, merged, alpha=lam).to(base.dtype)
