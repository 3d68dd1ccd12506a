"""The DP-SGD noise left in a released task vector, per coordinate (docs/design.md §6).

opacus adds N(0, σ²C²) per coordinate to the clipped gradient sum and divides by the expected batch
size B, so each step moves a directly trained parameter by noise of variance η_t²(σC/B)². Summed over
steps (the noise is independent across steps, and dominates the clipped signal at DP batch sizes):

    SGD:                    s² = (σC/B)² · Σ_t η_t²
    heavy-ball momentum μ:  s² = (σC/B)² · Σ_t η_t² / (1 − μ)²
    Adam / AdamW:           s² ≈ Σ_t η_t²     (noise-dominated: m̂/√v̂ has unit scale, whatever σ, C, B)

σ is the per-query noise multiplier: the update uses one privatised query even in two-query SAM mode.
These are upper bounds where curvature damps the walk. A LoRA delta ΔW = s·BA with independent noise
of variances s_B², s_A² in its factors (here both the optimizer's s²) has, per coordinate,

    Var(ΔW_ij) ≈ s²·[s_B²·‖A_{:,j}‖² + s_A²·‖B_{i,:}‖² + r·s_A²·s_B²].
"""

from __future__ import annotations

import torch

from hf_dpmerge.records.record import PrivacyRecord


def parameter_noise_variance(record: PrivacyRecord) -> float:
    """s² of a directly trained parameter, from the record's optimizer and noise settings (0 if not DP)."""
    if not record.dp:
        return 0.0
    name = str(record.optimizer.get("name", "")).lower()
    if "adam" in name:
        return float(record.sum_lr_squared)
    if name == "sgd":
        momentum = float(record.optimizer.get("momentum") or 0.0)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"SGD momentum {momentum} is outside [0, 1)")
        step = record.noise_multiplier * record.max_grad_norm / record.expected_batch_size
        return step**2 * record.sum_lr_squared / (1.0 - momentum) ** 2
    raise ValueError(
        f"no noise model for optimizer {record.optimizer.get('name')!r} (known: SGD, Adam, AdamW); "
        f"give the input's noise_std instead"
    )


def lora_noise_variance(
    lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float, factor_variance: float
) -> torch.Tensor:
    """Var(ΔW_ij) for ΔW = scaling·B·A (B: d_out×r, A: r×d_in), noise of ``factor_variance`` in A and B."""
    a2 = lora_a.double().square().sum(dim=0)  # ‖A_{:,j}‖², shape d_in
    b2 = lora_b.double().square().sum(dim=1)  # ‖B_{i,:}‖², shape d_out
    rank = lora_a.shape[0]
    variance = factor_variance * (a2.unsqueeze(0) + b2.unsqueeze(1)) + rank * factor_variance**2
    return (scaling**2 * variance).float()
