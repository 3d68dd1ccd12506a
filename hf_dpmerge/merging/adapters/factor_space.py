"""Linear merges of shared-A LoRA adapters computed on their B factors (docs/design.md §15.2).

Adapters trained with a frozen shared A (FFA-LoRA, ``--lora_freeze_a``) have τ_i = s·B_i·A, so per layer
Σ_i c_i·τ_i = s·(Σ_i c_i·B_i)·A: ``task_arithmetic`` is B = λ·Σ_i w_i·B_i and ``dp_aware`` B = λ·Σ_i w_i·B̂_i
(:func:`denoised_lora_b`; consensus ``precision_sign`` and ``random_effects`` are not linear in B and are
refused). ``cauchy_poe``'s fixed point, ``safe_merge``'s ``projection: away``/``onto`` and the spectral merges
(``tsv``, ``iso_c``, ``iso_cts``, ``wudi`` with ``solver: least_squares``) stay in A's row space, so their dense
result ζ (from the factors, float64) is read back as B' = ζ·Aᵀ(AAᵀ)⁻¹/s and checked (:func:`cauchy_poe_lora_b`,
:func:`safe_merge_lora_b`, :func:`spectral_lora_b`). A percentile mask and WUDI's Adam steps act on dense
coordinates and are refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from hf_dpmerge.lora import LoraFactor
from hf_dpmerge.merging.methods.iso import iso_c_merge, iso_cts_merge
from hf_dpmerge.merging.methods.tsv import tsv_merge
from hf_dpmerge.merging.methods.wudi import wudi_merge
from hf_dpmerge.noise.sure_threshold import sure_soft_threshold

SPECTRAL_KERNELS: dict[str, Callable[..., torch.Tensor]] = {
    "tsv": tsv_merge, "iso_c": iso_c_merge, "iso_cts": iso_cts_merge, "wudi": wudi_merge,
}  # method → kernel(task_vectors, edges=…, **its own YAML settings)
SPECTRAL_METHODS = tuple(SPECTRAL_KERNELS)
FACTOR_METHODS = ("task_arithmetic", "dp_aware", "cauchy_poe", "safe_merge", *SPECTRAL_METHODS)
FACTOR_RESIDUAL_RTOL = 1e-9  # ‖ζ − s·B'·A‖ ≤ this · ‖ζ‖ in float64, else ζ left A's row space
SHRINKAGES = ("scale", "soft_threshold")


def denoised_lora_b(lora_b: torch.Tensor, variance: torch.Tensor | float, lora_a: torch.Tensor,
                    shrinkage: str = "scale") -> torch.Tensor:
    """B̂ with s·B̂·A the dense ``dp_aware`` estimate of the delta s·B·A (A frozen, so Var(ΔW) = s²·V_B·A²):

    - ``scale``: c·B with c = max(0, 1 − Σ Var(ΔW)/‖ΔW‖²) = max(0, 1 − Σ (V_B·(A∘A))/‖B·A‖²) (s² cancels),
      the dense scale shrinkage of the delta (:func:`~hf_dpmerge.noise.shrinkage.sure_scale`);
    - ``soft_threshold``: the SURE soft threshold of B at V_B, as the dense path's
      :func:`~hf_dpmerge.merging.methods.dp_aware.lora_factor_estimate`.
    """
    b = lora_b.float()
    if shrinkage == "soft_threshold":
        return sure_soft_threshold(b, variance)
    if shrinkage != "scale":
        raise ValueError(f"shrinkage must be one of {SHRINKAGES}, got {shrinkage!r}")
    a = lora_a.double()
    total = float((torch.as_tensor(variance, dtype=torch.float64).expand(b.shape) @ a.square()).sum())
    if total <= 0:
        return b
    energy = float((b.double() @ a).square().sum())
    return b * (max(0.0, 1.0 - total / energy) if energy > 0 else 0.0)


def merged_lora_b(
    lora_bs: Sequence[torch.Tensor],
    weights: Sequence[float],
    lam: float,
    variances: Sequence[torch.Tensor | float] | None = None,
    lora_a: torch.Tensor | None = None,
    shrinkage: str = "scale",
) -> torch.Tensor:
    """One layer's merged B: λ·Σ_i w_i·B_i, each B_i denoised at its noise variance V_B,i when ``variances`` is
    given (``dp_aware``, :func:`denoised_lora_b` with the shared ``lora_a``), in float32."""
    estimates = ([b.float() for b in lora_bs] if variances is None else
                 [denoised_lora_b(b, v, lora_a, shrinkage) for b, v in zip(lora_bs, variances, strict=True)])
    return lam * sum(w * e for w, e in zip(weights, estimates, strict=True))


def cauchy_poe_lora_b(
    lora_bs: Sequence[torch.Tensor],
    lora_a: torch.Tensor,
    scaling: float,
    lam: float,
    name: str,
    noise_variance: Sequence[float] | None = None,
    **options: Any,
) -> torch.Tensor:
    """One layer's merged B for ``cauchy_poe``: B' with s·B'·A the dense merge λζ of the τ_i = s·B_i·A.

    ``options`` are the kernel's (``tol``, ``jitter``, ``max_iter``, ``conv_tol``, ``layers``); ``noise_variance``
    the mean per-coordinate noise variance of each τ_i (DP-calibrated widths) or None.
    """
    from hf_dpmerge.merging.methods.cauchy_poe import cauchy_poe_merge

    a = lora_a.double()
    factors = [(scaling * b.double(), a) for b in lora_bs]
    base = torch.zeros(lora_bs[0].shape[0], a.shape[1], dtype=torch.float64)
    merged = cauchy_poe_merge(base, [left @ right for left, right in factors], lam=lam, name=name,
                              noise_variance=noise_variance, factors=factors, **options)
    return read_back_lora_b(merged, a, scaling, name, "cauchy_poe")


def spectral_lora_b(method: str, lora_bs: Sequence[torch.Tensor], shared: LoraFactor, lam: float, name: str,
                    edges: Sequence[float] | None, options: dict[str, Any]) -> torch.Tensor:
    """One layer's merged B for a spectral ``method``: B' with s·B'·A = λ·(its kernel on the τ_i = s·B_i·A), ``shared``
    giving A, s and the layout: from the factors in float64 and in the weight's layout, as the dense kernel
    (``fan_in_fan_out``: (s·B·A)ᵀ); ``edges`` the inputs' noise edges (``noise_floor: record``) or None, ``options``
    the method's own settings (``k``, ``common_space_fraction``, ``steps``/``lr``/``solver``)."""
    a, scaling, transposed = shared.lora_a.double(), shared.scaling, shared.fan_in_fan_out
    factors = [(a.T, scaling * b.double().T) if transposed else (scaling * b.double(), a) for b in lora_bs]
    merged = lam * SPECTRAL_KERNELS[method](factors, edges=edges, **options)
    return read_back_lora_b(merged.T if transposed else merged, a, scaling, name, method)


def safe_merge_lora_b(
    lora_bs: Sequence[torch.Tensor],
    weights: Sequence[float],
    unwanted: Sequence[bool],
    lora_a: torch.Tensor,
    scaling: float,
    scale: float,
    projection: str,
    name: str,
    fan_in_fan_out: bool = False,
) -> torch.Tensor:
    """One layer's merged B for ``safe_merge`` with a ``projection``: B' with s·B'·A the dense
    ``scale·(I − P or P)·Σ_useful w_i·τ_i`` (:func:`~..methods.safe_merge.project` on the weight's first
    axis, as the dense kernel), solved in float64 and read back."""
    from hf_dpmerge.merging.methods.safe_merge import project, subspace_basis

    a = lora_a.double()
    deltas = [scaling * b.double() @ a for b in lora_bs]  # in B·A's layout; the weight's is its transpose if fifo
    stored = [d.T if fan_in_fan_out else d for d in deltas]
    useful = sum(w * d for d, w, u in zip(stored, weights, unwanted, strict=True) if not u)
    merged = scale * project(useful, subspace_basis([d for d, u in zip(stored, unwanted) if u]), projection)
    return read_back_lora_b(merged.T if fan_in_fan_out else merged, a, scaling, name, "safe_merge")


def read_back_lora_b(merged: torch.Tensor, lora_a: torch.Tensor, scaling: float, name: str,
                     method: str) -> torch.Tensor:
    """B' = ζ·Aᵀ(AAᵀ)⁻¹/s of a dense float64 merge ζ (in B·A's layout), refused unless s·B'·A = ζ: the merge
    must stay in the shared A's row space for the adapter to be exact."""
    a = lora_a.double()
    lora_b = merged @ a.T @ torch.linalg.inv(a @ a.T) / scaling
    residual = float((scaling * lora_b @ a - merged).norm())
    if residual > FACTOR_RESIDUAL_RTOL * max(float(merged.norm()), 1e-30):
        raise RuntimeError(f"{name}: the {method} merge left the shared A's row space (residual {residual:.3g}); "
                           "use the dense merge")
    return lora_b.float()
