"""TSV-Merge (Gargiulo et al., CVPR 2025, arXiv 2412.00081, §5): with τ_i = U_i·Σ_i·V_iᵀ, keep each task's top k
components, stack U = [U_1,k … U_T,k], V likewise, Σ = blockdiag(Σ_i,k), decorrelate U and V by their orthogonal
polar factors (U = P·S·Qᵀ ⇒ U⊥ = P·Qᵀ) and

    τ_TSV = U⊥·Σ·V⊥ᵀ,      k = ⌊R/T⌋,

R = min(d_out, d_in) for full-rank τ_i (the paper's), in general the dimension of the joint span of their singular
vectors (r for LoRA deltas sharing one rank-r A: the T·k directions fit and the merge stays in A's row space).
Output W_0 + λ·τ_TSV, λ = 1 (the paper's α; orthogonal tasks give Σ_i τ_i).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hf_dpmerge.merging.methods.spectral import TaskVector, joint_rank, partial_isometry, task_spectra, zero_task_vector


def tsv_merge(task_vectors: Sequence[TaskVector], k: int | None = None,
              edges: Sequence[float] | None = None) -> torch.Tensor:
    """τ_TSV of the module docstring (``k`` None: ⌊R/T⌋, at least 1; T counts the nonzero task vectors), each
    spectrum first truncated at its noise edge when ``edges`` are given."""
    spectra = [s for s in task_spectra(task_vectors, edges) if s.rank]
    if not spectra:
        return zero_task_vector(task_vectors)
    kept = [s.top(k or max(1, joint_rank(spectra) // len(spectra))) for s in spectra]
    left = partial_isometry(torch.cat([s.left for s in kept], dim=1))
    right = partial_isometry(torch.cat([s.right for s in kept], dim=1))
    return (left * torch.cat([s.values for s in kept])) @ right.T
