"""The noise floor of a DP task vector: the largest singular value its DP noise alone would reach (torch only).

A d_out × d_in matrix of i.i.d. N(0, s²) entries has its top singular value at the Marchenko–Pastur edge
s·(√d_out + √d_in). For N·R with N (d_out × k) of independent entries of variances V_ik and R fixed (Chevet):

    E‖N·R‖ ≤ σ_1(diag(√c)·R) + max_i √(Σ_k V_ik·‖R_k:‖²),        c_k = Σ_i V_ik

(R = I: the dense edge). A LoRA delta s·B̃·Ã carries s·(N_B·Ã + B̃·N_A + N_B·N_A), bounded term by term; with A
frozen (FFA-LoRA) the bound is s·e(V_B, A), the MP edge of an r-column noise matrix scaled by A's singular values.
Singular directions below the edge are indistinguishable from noise: dropping them is post-processing of released
weights (docs/merging.md).
"""

from __future__ import annotations

import torch


def noise_edge(variance: torch.Tensor | float, shape: tuple[int, int], right: torch.Tensor | None = None) -> float:
    """The bound e(V, R) of the module docstring for N·R (N of ``shape`` d_out × k with entry variances V, a
    scalar or a map); ``right`` None is R = I (a dense noise matrix)."""
    v = torch.as_tensor(variance, dtype=torch.float64).expand(shape)
    column_sums = v.sum(dim=0)
    if right is None:
        return float(column_sums.max().sqrt() + v.sum(dim=1).max().sqrt())
    r = right.double().to(v.device)
    spread = float(torch.linalg.matrix_norm(column_sums.sqrt().unsqueeze(1) * r, ord=2))
    return spread + float((v @ r.square().sum(dim=1)).max().sqrt())


def lora_noise_edge(
    lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float,
    variance_a: torch.Tensor | float, variance_b: torch.Tensor | float,
) -> float:
    """The noise edge of ΔW = s·B·A (B: d_out × r, A: r × d_in) with factor noise variances V_A, V_B (module
    docstring; V_A = 0: frozen A, s·e(V_B, A))."""
    (rank, d_in), d_out = lora_a.shape, lora_b.shape[0]
    edge = noise_edge(variance_b, (d_out, rank), lora_a)
    v_a = torch.as_tensor(variance_a, dtype=torch.float64).expand(rank, d_in)
    if not bool(v_a.any()):
        return abs(scaling) * edge
    edge_a = noise_edge(v_a.T, (d_in, rank), lora_b.T)  # B̃·N_A = (N_Aᵀ·B̃ᵀ)ᵀ
    product = noise_edge(variance_b, (d_out, rank)) * noise_edge(v_a, (rank, d_in))
    return abs(scaling) * (edge + edge_a + product)
