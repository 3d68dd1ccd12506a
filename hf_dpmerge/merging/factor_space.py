"""Linear merges of shared-A LoRA adapters computed on their B factors (docs/design.md §15.2).

Adapters trained with a frozen shared A (FFA-LoRA, ``--lora_freeze_a``) have task vectors τ_i = s·B_i·A in one
row space, so per layer

    Σ_i c_i·τ_i = s·(Σ_i c_i·B_i)·A

and a merge that combines the τ_i linearly is exactly the LoRA adapter with the same A and merged B:

- ``task_arithmetic``: B = λ·Σ_i w_i·B_i (mergekit's ``task_arithmetic`` of the τ_i, unnormalised);
- ``dp_aware``: B = λ·Σ_i w_i·SURE(B_i; V_B,i), the factor-space estimate the dense ``dp_aware`` uses for a
  LoRA input (:func:`~hf_dpmerge.merging.dp_aware.lora_factor_estimate`: θ̂_i = s·SURE(B_i)·A), combined before
  the shared s·(·)·A is applied. It equals the dense ``dp_aware`` merge with its defaults; ``precision_sign``
  (a sign election per dense coordinate) and ``random_effects`` (τ² from the dense task vectors) are not linear
  in B and are refused.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hf_dpmerge.merging.dp_aware import dp_aware_merge

FACTOR_METHODS = ("task_arithmetic", "dp_aware")


def merged_lora_b(
    lora_bs: Sequence[torch.Tensor],
    weights: Sequence[float],
    lam: float,
    variances: Sequence[torch.Tensor | float] | None = None,
) -> torch.Tensor:
    """One layer's merged B: λ·Σ_i w_i·B_i, each B_i SURE-denoised at its noise variance V_B,i when ``variances``
    is given (``dp_aware``; a zero variance leaves B_i as is). The dp_aware kernel on base 0, in float32."""
    zero = torch.zeros_like(lora_bs[0], dtype=torch.float32)
    noise = [0.0] * len(lora_bs) if variances is None else variances
    return dp_aware_merge(zero, [b.float() for b in lora_bs], noise, weights=weights, lam=lam)
