"""Isotropic merging (Marczak et al., 2025, arXiv 2502.04959, §4). Iso-C flattens the spectrum of the sum:

    Σ_i τ_i = U·Σ·Vᵀ  ⇒  τ_Iso-C = σ̄·U·Vᵀ,      σ̄ = mean of the sum's singular values.

Iso-CTS keeps the sum's top k_c ≈ f·R directions (f = 0.8, rounded so that T divides R − k_c), adds each task's top
(R − k_c)/T directions of (I − U_c·U_cᵀ)·τ_i, decorrelates the stacked U, V by their polar factors (as TSV-M) and
flattens: τ = σ̄·U⊥·V⊥ᵀ, σ̄ the mean stacked singular value. R = min(d_out, d_in) for full-rank τ_i, else their
joint rank (r for LoRA deltas sharing A). Only nonzero singular values count (a LoRA sum's others have arbitrary
vectors). Output W_0 + λ·τ, λ = 1 (sum scale).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hf_dpmerge.merging.methods.spectral import (
    Spectrum,
    TaskVector,
    computing_dtype,
    joint_rank,
    partial_isometry,
    spectrum,
    sum_spectrum,
    summed,
    task_spectra,
    zero_task_vector,
)


def iso_c_merge(task_vectors: Sequence[TaskVector], edges: Sequence[float] | None = None) -> torch.Tensor:
    """τ_Iso-C (module docstring), each spectrum first truncated at its noise edge when ``edges`` are given (else
    only the sum's SVD is needed)."""
    if edges is None:
        total = spectrum(summed(task_vectors), computing_dtype(task_vectors))
    else:
        spectra = [s for s in task_spectra(task_vectors, edges) if s.rank]
        total = sum_spectrum(spectra) if spectra else None
    if total is None or not total.rank:
        return zero_task_vector(task_vectors)
    return total.values.mean() * total.left @ total.right.T


def common_space_sizes(rank: int, tasks: int, common_space_fraction: float) -> tuple[int, int]:
    """(k_c, n): the common subspace's size and each task's, k_c + T·n = R (the paper's rounding)."""
    common = int(rank * common_space_fraction)
    per_task = round((rank - common) / tasks)
    return rank - per_task * tasks, per_task


def _residual(task: Spectrum, common: torch.Tensor) -> Spectrum:
    left, right = task.factors()
    return spectrum((left - common @ (common.T @ left), right), left.dtype)


def iso_cts_merge(task_vectors: Sequence[TaskVector], common_space_fraction: float = 0.8,
                  edges: Sequence[float] | None = None) -> torch.Tensor:
    """τ_Iso-CTS (module docstring), each spectrum first truncated at its noise edge when ``edges`` are given."""
    spectra = [s for s in task_spectra(task_vectors, edges) if s.rank]
    if not spectra:
        return zero_task_vector(task_vectors)
    common_size, per_task = common_space_sizes(joint_rank(spectra), len(spectra), common_space_fraction)
    parts = [sum_spectrum(spectra).top(common_size)]
    if per_task:
        parts += [_residual(s, parts[0].left).top(per_task) for s in spectra]
    values = torch.cat([p.values for p in parts])
    if not values.numel():
        return zero_task_vector(task_vectors)
    left = partial_isometry(torch.cat([p.left for p in parts], dim=1))
    right = partial_isometry(torch.cat([p.right for p in parts], dim=1))
    return values.mean() * left @ right.T
