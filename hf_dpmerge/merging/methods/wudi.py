"""WUDI-Merging (Cheng et al., ICML 2025, arXiv 2503.08099, §4): a τ_i's rows span task i's inputs, so minimise

    L(τ) = Σ_i ‖(τ − τ_i)·τ_iᵀ‖_F² / ‖τ_i‖_F²,   ∇L = 2·(τ·M − C),   M = Σ_i τ_iᵀτ_i/‖τ_i‖², C = Σ_i τ_iτ_iᵀτ_i/‖τ_i‖²

``solver: adam`` as the paper (300 Adam steps, lr 1e-5, from the sum Σ_i τ_i: an early-stopped descent) or
``least_squares``, its limit in the tasks' row space τ* = C·M⁺. M and C live in an orthonormal basis Q of the joint
row space when the τ_i are factored (LoRA: q ≤ T·r): a step costs O(d_out·d_in·q). τ* keeps its rows in that space
(shared-A adapters stay an adapter); Adam's per-coordinate steps leave it. Output W_0 + λ·τ (λ = 1: no rescaling).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from hf_dpmerge.merging.methods.spectral import TaskVector, computing_dtype, task_spectra, zero_task_vector

Solver = Literal["adam", "least_squares"]


def _row_basis(rights: Sequence[torch.Tensor]) -> torch.Tensor:
    """An orthonormal basis Q (d_in × q) of the span of the rows of the R_i, above its numerical rank."""
    stacked = torch.cat(list(rights), dim=0).T
    left, values, _ = torch.linalg.svd(stacked, full_matrices=False)
    tolerance = max(stacked.shape) * torch.finfo(values.dtype).eps * float(values[0])
    return left[:, values > tolerance]


def _squared_norm(left: torch.Tensor, right: torch.Tensor | None) -> float:
    """‖L·R‖_F² = Σ (LᵀL) ∘ (R·Rᵀ), or ‖L‖_F² for a dense τ (``right`` None)."""
    return float(left.square().sum() if right is None else ((left.T @ left) * (right @ right.T)).sum())


def wudi_merge(task_vectors: Sequence[TaskVector], steps: int = 300, lr: float = 1e-5, solver: Solver = "adam",
               edges: Sequence[float] | None = None) -> torch.Tensor:
    """The merged τ of the module docstring; with ``edges`` each τ_i is first truncated at its noise edge."""
    dtype = computing_dtype(task_vectors)
    if edges is not None:
        task_vectors = [s.factors() for s in task_spectra(task_vectors, edges)]
    pairs = [(t[0].to(dtype), t[1].to(dtype)) if isinstance(t, tuple) else (t.to(dtype), None) for t in task_vectors]
    pairs = [(left, right, 1 / norm) for left, right in pairs if (norm := _squared_norm(left, right)) > 0]
    if not pairs:
        return zero_task_vector(task_vectors)
    basis = None if any(right is None for _, right, _ in pairs) else _row_basis([right for _, right, _ in pairs])
    rows = [left if right is None else left @ (right if basis is None else right @ basis) for left, right, _ in pairs]
    weights = [weight for _, _, weight in pairs]
    gram = sum(w * y.T @ y for w, y in zip(weights, rows))  # M (in the basis: QᵀMQ)
    target = sum(w * y @ (y.T @ y) for w, y in zip(weights, rows))  # C (C·Q)

    def expand(reduced: torch.Tensor) -> torch.Tensor:
        return reduced if basis is None else reduced @ basis.T

    if solver == "least_squares":
        return expand(target @ torch.linalg.pinv(gram, hermitian=True))
    if basis is not None:  # Adam's early-stopped steps in float32, as the paper's
        basis = basis.float()
    gram, target = gram.float(), target.float()
    merged = torch.nn.Parameter(expand(sum(rows).float()))
    optimizer = torch.optim.Adam([merged], lr=lr)
    for _ in range(steps):
        reduced = merged.detach() if basis is None else merged.detach() @ basis
        merged.grad = 2 * expand(reduced @ gram - target)
        optimizer.step()
    return merged.detach().to(dtype)
