"""Singular-value tools of the spectral merges (:mod:`.tsv`, :mod:`.iso`, :mod:`.wudi`; torch only).

A task vector is a 2-D τ (d_out × d_in, the weight's layout) given densely or as factors (L, R) with τ = L·R,
e.g. (s·B, A) for a LoRA delta: its thin SVD then comes from QR of L and Rᵀ and the SVD of a small core, exact in
float64, and every right singular vector stays in R's row space (so merges built from them stay in a shared A's
row space). A :class:`Spectrum` keeps the components above the numerical rank, σ_k > max(d_out, d_in)·ε·σ_1 (ε of
the computing dtype): the singular vectors of zero singular values are arbitrary, and no merge may depend on them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

TaskVector = torch.Tensor | tuple[torch.Tensor, torch.Tensor]
EMBEDDING_NAMES = ("embed", "wte", "wpe")


def is_embedding(name: str) -> bool:
    """Whether a tensor is an embedding table by its name (holding ``embed``, ``wte`` or ``wpe``)."""
    return any(key in name.lower() for key in EMBEDDING_NAMES)


def merged_as_matrix(name: str, shape: torch.Size) -> bool:
    """Whether the spectral merges act on a tensor's singular vectors: 2-D and not an embedding (the papers merge
    1-D tensors and embeddings by task arithmetic)."""
    return len(shape) == 2 and not is_embedding(name)


@dataclass(frozen=True)
class Spectrum:
    """τ = U·diag(S)·Vᵀ above τ's numerical rank: ``left`` U (d_out × ρ), ``values`` S (ρ, descending), ``right``
    V (d_in × ρ)."""

    left: torch.Tensor
    values: torch.Tensor
    right: torch.Tensor

    @property
    def rank(self) -> int:
        return int(self.values.numel())

    def top(self, count: int) -> Spectrum:
        """The ``count`` largest components (all of them when there are fewer)."""
        return Spectrum(self.left[:, :count], self.values[:count], self.right[:, :count])

    def above(self, edge: float) -> Spectrum:
        """The components with σ_k > ``edge``."""
        return self.top(int((self.values > edge).sum()))

    def factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(U·diag(S), Vᵀ): τ as a product of factors."""
        return self.left * self.values, self.right.T

    def dense(self) -> torch.Tensor:
        left, right = self.factors()
        return left @ right


def _rank_tolerance(shape: tuple[int, int], values: torch.Tensor) -> float:
    if values.numel() == 0:
        return 0.0
    return max(shape) * torch.finfo(values.dtype).eps * float(values[0])


def computing_dtype(task_vectors: Sequence[TaskVector]) -> torch.dtype:
    """float64 when any input is factored (LoRA deltas, solved exactly) or float64; float32 otherwise."""
    wide = any(isinstance(t, tuple) or t.dtype == torch.float64 for t in task_vectors)
    return torch.float64 if wide else torch.float32


def zero_task_vector(task_vectors: Sequence[TaskVector]) -> torch.Tensor:
    """A zero τ of the task vectors' shape, dtype (:func:`computing_dtype`) and device: the merge of nothing."""
    first = task_vectors[0]
    left, right = first if isinstance(first, tuple) else (first, first)
    return torch.zeros(left.shape[0], right.shape[1], dtype=computing_dtype(task_vectors), device=left.device)


def spectrum(task_vector: TaskVector, dtype: torch.dtype = torch.float64) -> Spectrum:
    """The thin SVD of τ (dense, or τ = L·R) in ``dtype``, above its numerical rank. Factors of inner size k at
    least half of min(d_out, d_in) are multiplied out (the dense SVD is then as cheap)."""
    if isinstance(task_vector, tuple):
        left, right = (part.to(dtype) for part in task_vector)
        shape = (left.shape[0], right.shape[1])
        if 2 * left.shape[1] < min(shape):
            q_left, r_left = torch.linalg.qr(left)
            q_right, r_right = torch.linalg.qr(right.T)
            core_left, values, core_right = torch.linalg.svd(r_left @ r_right.T, full_matrices=False)
            u, v = q_left @ core_left, q_right @ core_right.T
        else:
            u, values, v_t = torch.linalg.svd(left @ right, full_matrices=False)
            v = v_t.T
    else:
        dense = task_vector.to(dtype)
        shape = tuple(dense.shape)
        u, values, v_t = torch.linalg.svd(dense, full_matrices=False)
        v = v_t.T
    keep = int((values > _rank_tolerance(shape, values)).sum())
    return Spectrum(u[:, :keep], values[:keep], v[:, :keep])


def task_spectra(task_vectors: Sequence[TaskVector], edges: Sequence[float] | None = None) -> list[Spectrum]:
    """Each task vector's spectrum (in :func:`computing_dtype`), truncated at its noise edge when ``edges`` are
    given (:mod:`hf_dpmerge.noise.floor`: directions below it carry noise only)."""
    dtype = computing_dtype(task_vectors)
    spectra = [spectrum(t, dtype) for t in task_vectors]
    return spectra if edges is None else [s.above(e) for s, e in zip(spectra, edges, strict=True)]


def _stacked_rank(bases: Sequence[torch.Tensor]) -> int:
    stacked = torch.cat(list(bases), dim=1)
    if stacked.shape[1] == 0:
        return 0
    values = torch.linalg.svdvals(stacked)
    return int((values > _rank_tolerance(tuple(stacked.shape), values)).sum())


def joint_rank(spectra: Sequence[Spectrum]) -> int:
    """R = min(dim of the span of all left singular vectors, dim of the span of all right ones): min(d_out, d_in)
    for full-rank task vectors (the papers' R), r for LoRA deltas sharing one rank-r A."""
    full = min(spectra[0].left.shape[0], spectra[0].right.shape[0])
    if any(s.rank == full for s in spectra):
        return full
    return min(_stacked_rank([s.left for s in spectra]), _stacked_rank([s.right for s in spectra]))


def summed(task_vectors: Sequence[TaskVector]) -> TaskVector:
    """Σ_i τ_i: the stacked factors [L_1 … L_T]·[R_1; …; R_T] when every τ_i is factored, else dense."""
    dtype = computing_dtype(task_vectors)
    if all(isinstance(t, tuple) for t in task_vectors):
        lefts, rights = zip(*task_vectors)
        return torch.cat(lefts, dim=1).to(dtype), torch.cat(rights).to(dtype)
    return sum((t[0] @ t[1] if isinstance(t, tuple) else t).to(dtype) for t in task_vectors)


def sum_spectrum(spectra: Sequence[Spectrum]) -> Spectrum:
    """The spectrum of Σ_i τ_i, from the stacked factors [U_1·S_1 … U_T·S_T]·[V_1 … V_T]ᵀ."""
    lefts, rights = zip(*(s.factors() for s in spectra))
    return spectrum((torch.cat(lefts, dim=1), torch.cat(rights, dim=0)), spectra[0].values.dtype)


def partial_isometry(stacked: torch.Tensor) -> torch.Tensor:
    """The orthogonal polar factor P·Qᵀ of ``stacked`` = P·S·Qᵀ (the nearest matrix with orthonormal columns), on
    its nonzero singular values: for a stack of dependent directions it is the partial isometry, not an arbitrary
    completion."""
    left, values, right_t = torch.linalg.svd(stacked, full_matrices=False)
    keep = int((values > _rank_tolerance(tuple(stacked.shape), values)).sum())
    return left[:, :keep] @ right_t[:keep]
