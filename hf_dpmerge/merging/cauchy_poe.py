"""Cauchy product-of-experts merge of task vectors (Le Van et al., arXiv 2607.01689, §4–5).

Per weight matrix, with task vectors τ_i = W_i − W_0 in torch's d_out×d_in layout, the merged update ζ is
the MAP estimate under a product of Cauchy experts on the directional residuals τ_iᵀ(ζ − τ_i):

    E(ζ) = Σ_i log(γ_i² + ‖τ_iᵀ(ζ − τ_i)‖_F²) + j‖ζ‖_F²,        γ_i² = ‖τ_i‖_F²·(tol + d_in·s_i²)

(s_i² = 0 gives the paper's γ_i² = tol·‖τ_i‖²; s_i² > 0 is the DP-calibrated width, docs/design.md §5).
log is concave, so E is majorised by a quadratic at the current iterate; minimising it gives the MM/IRLS
fixed point (§5, Algorithm 1), started from α ≡ 1:

    α_i = 1 / (γ_i² + ‖τ_iᵀ(ζ − τ_i)‖_F²),     ζ ← (Σ_i α_i τ_iτ_iᵀ + jI)⁻¹ Σ_i α_i τ_iτ_iᵀτ_i

E never increases along the iterates. The output is W_0 + λζ.

Exact low-rank path: every iterate lies in the span of the task vectors' columns. With an orthonormal
basis U (d_out×k) of that span and c_i = Uᵀτ_i, the same iteration on c_i gives z with ζ = Uz, the same
residual norms ‖c_iᵀ(z − c_i)‖ and the same energy, at O(k³ + k²·d_in) per iteration instead of
O(d_out³ + d_out²·d_in) (k ≤ N·r for LoRA deltas). For full-rank matrices with N·d_in ≤ d_out (embeddings,
MLP up-projections) the same iterates are computed in the N·d_in-dimensional dual space (:func:`dual_iterates`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence

import torch

_SKETCH_START = 64
_BASIS_RTOL = 1e-4
_JITTER_RETRIES = 3


def cauchy_energy(zeta: torch.Tensor, taus: torch.Tensor, gamma2: torch.Tensor, jitter: float) -> float:
    """E(ζ) straight from its definition (taus: N×d_out×d_in, gamma2: N)."""
    residuals = torch.stack([(tau.T @ (zeta - tau)).square().sum() for tau in taus])
    return float(torch.log(gamma2 + residuals).sum() + jitter * zeta.square().sum())


def _cholesky(
    fill: Callable[[torch.Tensor, float], None], buffer: torch.Tensor, jitter: float, name: str
) -> torch.Tensor:
    """Cholesky factor of the system ``fill(buffer, extra)`` writes, computed in ``buffer`` (no second n×n
    matrix); on failure refill with more jitter (×10, up to 3 times), then raise."""
    info = torch.empty((), dtype=torch.int32, device=buffer.device)
    extra = 0.0
    for attempt in range(_JITTER_RETRIES + 1):
        if attempt:
            extra = max(jitter, 1e-12) * 10**attempt
        fill(buffer, extra)
        torch.linalg.cholesky_ex(buffer, out=(buffer, info))
        if int(info) == 0:
            break
    else:
        raise ValueError(
            f"cauchy_poe: {name}: Cholesky of Σα_iτ_iτ_iᵀ + jI failed even with jitter {extra:.3g}; "
            f"the task vectors may hold inf/NaN or the matrix is too ill-conditioned (raise `jitter`)"
        )
    if extra:
        warnings.warn(f"cauchy_poe: {name}: Cholesky needed extra jitter {extra:.3g}", stacklevel=3)
    return buffer


def fixed_point_iterates(
    taus: torch.Tensor,
    gamma2: torch.Tensor,
    jitter: float,
    max_iter: int,
    conv_tol: float,
    name: str = "tensor",
) -> Iterator[torch.Tensor]:
    """Yield the MM iterates ζ_1, ζ_2, … until ‖ζ_t − ζ_{t−1}‖_F < conv_tol or ``max_iter`` iterates.

    ``taus`` is N×m×d_in in any orthonormal coordinates of the column space (m = d_out when dense).
    Residual norms use the Grams: ‖τ_iᵀ(ζ − τ_i)‖² = ⟨G_i, ζζᵀ⟩ − 2⟨G_iτ_i, ζ⟩ + ‖G_i‖², G_i = τ_iτ_iᵀ.
    G_i and G_iτ_i are formed once in the inputs' precision; the iteration runs in float64, because the
    system Σα_iG_i + jI grows ill-conditioned (α_i ≈ 1/γ_i² ≫ j) and float32 iterates would wander.
    """
    count, rows, _ = taus.shape
    grams = torch.empty(count, rows * rows, dtype=torch.float64, device=taus.device)
    targets = torch.empty(count, taus[0].numel(), dtype=torch.float64, device=taus.device)
    for index, tau in enumerate(taus):
        gram = tau @ tau.T
        grams[index] = gram.reshape(-1)
        targets[index] = (gram @ tau).reshape(-1)
    gamma2 = gamma2.double()
    constant = grams.square().sum(dim=1)
    alpha = torch.ones_like(gamma2)
    previous = None
    buffer = torch.empty(rows, rows, dtype=torch.float64, device=taus.device)

    def fill(system: torch.Tensor, extra: float) -> None:  # Σα_iG_i + (j + extra)I
        torch.mv(grams.T, alpha, out=system.view(-1))
        system.diagonal().add_(jitter + extra)

    for _ in range(max_iter):
        rhs = (alpha @ targets).reshape(rows, -1)
        zeta = torch.cholesky_solve(rhs, _cholesky(fill, buffer, jitter, name))
        yield zeta
        if previous is not None and float(torch.linalg.norm(zeta - previous)) < conv_tol:
            return
        residual = grams @ (zeta @ zeta.T).reshape(-1) - 2 * (targets @ zeta.reshape(-1)) + constant
        alpha = 1.0 / (gamma2 + residual.clamp_min(0))
        previous = zeta


def dual_iterates(
    taus: torch.Tensor,
    gamma2: torch.Tensor,
    jitter: float,
    max_iter: int,
    conv_tol: float,
    name: str = "tensor",
) -> Iterator[torch.Tensor]:
    """The same iterates as :func:`fixed_point_iterates`, as Y_t with ζ_t = T·Y_t, T = [τ_1 … τ_N] (d_out×n).

    With K = TᵀT (n×n, n = N·d_in), A = diag(α_i·I) and B = [τ_1ᵀτ_1; …; τ_Nᵀτ_N] (the diagonal blocks
    of K), the push-through identity gives (TATᵀ + jI)⁻¹·TAB = T·(K + jA⁻¹)⁻¹·B, so Y = (K + jA⁻¹)⁻¹B;
    the residuals are the blocks τ_iᵀ(ζ − τ_i) = (KY − B)_i (no cancellation) and ‖ζ_t − ζ_{t−1}‖² =
    tr(ΔYᵀKΔY). It needs no d_out×d_out matrix: as cheap as the primal solve when n = d_out, cheaper and
    lighter when n < d_out (tall matrices such as embeddings and MLP up-projections).
    """
    count, _, cols = taus.shape
    kernel = torch.empty(count * cols, count * cols, dtype=torch.float64, device=taus.device)
    for i in range(count):
        for j in range(i, count):
            block = taus[i].T @ taus[j]
            kernel[i * cols : (i + 1) * cols, j * cols : (j + 1) * cols] = block
            kernel[j * cols : (j + 1) * cols, i * cols : (i + 1) * cols] = block.T
    blocks = torch.cat([kernel[i * cols : (i + 1) * cols, i * cols : (i + 1) * cols] for i in range(count)])
    gamma2 = gamma2.double()
    alpha = torch.ones_like(gamma2)
    previous = None
    buffer = torch.empty_like(kernel)

    def fill(system: torch.Tensor, extra: float) -> None:  # K + jA⁻¹ + extra·I
        system.copy_(kernel).diagonal().add_((jitter / alpha).repeat_interleave(cols) + extra)

    for _ in range(max_iter):
        coords = torch.cholesky_solve(blocks, _cholesky(fill, buffer, jitter, name))
        yield coords
        image = kernel @ coords
        if previous is not None:
            step2 = ((coords - previous[0]) * (image - previous[1])).sum()
            if float(step2.clamp_min(0).sqrt()) < conv_tol:
                return
        residual = (image - blocks).reshape(count, cols, cols).square().sum(dim=(1, 2))
        alpha = 1.0 / (gamma2 + residual)
        previous = coords, image


def thin_basis(
    taus: torch.Tensor, rtol: float = _BASIS_RTOL, max_width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(U, C): orthonormal U (d_out×k) and coordinates C (N×k×d_in) with τ_i = U·C_i to ``rtol``, or None.

    U spans a Gaussian sketch Σ_i τ_iΩ_i of width 64, then ``max_width`` (default d_out/2, beyond which
    the dense solve costs about as much). A sketch of full numerical rank (every |R_jj| > rtol·max|R_jj|)
    means the span may be wider still; in a rank-deficient one the columns with small R_jj are dependent
    and dropped, and U is accepted once ‖τ_i − UUᵀτ_i‖_F ≤ rtol·‖τ_i‖_F for every i.
    """
    count, rows, cols = taus.shape
    limit = min(rows // 2, max_width or rows)
    generator = torch.Generator(device=taus.device).manual_seed(0)
    norms = torch.linalg.norm(taus.reshape(count, -1), dim=1)
    for width in sorted({min(_SKETCH_START, limit), limit} - {0}):
        omega = torch.randn(count, cols, width, generator=generator, dtype=taus.dtype, device=taus.device)
        basis, upper = torch.linalg.qr(combine(taus, omega))
        diagonal = upper.diagonal().abs()
        independent = diagonal > rtol * diagonal.max()
        if bool(independent.all()):
            continue  # the sketch has full rank: the span may be wider still
        basis = basis[:, independent]
        coords = basis.T @ taus
        error = torch.stack([torch.linalg.norm(tau - basis @ coord) for tau, coord in zip(taus, coords)])
        if bool((error <= rtol * norms).all()):
            return basis, coords
    return None


def combine(taus: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
    """Σ_i τ_i·Y_i for τ: N×d_out×d_in and Y: N×d_in×p (a d_out×p matrix)."""
    total = taus[0] @ coords[0]
    for tau, coord in zip(taus[1:], coords[1:]):
        total.addmm_(tau, coord)
    return total


def cauchy_poe_delta(
    taus: torch.Tensor,
    gamma2: torch.Tensor,
    jitter: float,
    max_iter: int,
    conv_tol: float,
    low_rank: bool = True,
    name: str = "tensor",
) -> torch.Tensor:
    """The converged ζ for N×d_out×d_in task vectors.

    With ``low_rank`` the iteration runs in the smallest exact coordinates available: a thin basis of
    the task vectors' span when one is found, else the dual space when N·d_in ≤ d_out; otherwise (and
    without ``low_rank``) densely in d_out×d_out.
    """
    count, rows, cols = taus.shape
    dual = count * cols <= rows
    thin = thin_basis(taus, max_width=_SKETCH_START if dual else None) if low_rank else None
    if thin is not None:
        basis, coords = thin
        zeta = _last(fixed_point_iterates(coords, gamma2, jitter, max_iter, conv_tol, name))
        return basis @ zeta.to(taus.dtype)
    if low_rank and dual:
        coords = _last(dual_iterates(taus, gamma2, jitter, max_iter, conv_tol, name))
        return combine(taus, coords.to(taus.dtype).reshape(count, cols, -1))
    return _last(fixed_point_iterates(taus, gamma2, jitter, max_iter, conv_tol, name)).to(taus.dtype)


def _last(iterates: Iterator[torch.Tensor]) -> torch.Tensor:
    for value in iterates:
        pass
    return value


def cauchy_poe_merge(
    base: torch.Tensor,
    finetuned: Sequence[torch.Tensor],
    *,
    lam: float,
    tol: float,
    jitter: float,
    max_iter: int,
    conv_tol: float,
    noise_variance: Sequence[float] | None = None,
    name: str = "tensor",
) -> torch.Tensor:
    """W_0 + λζ for one tensor. 1-D tensors (biases, norms) merge by task arithmetic, W_0 + λΣτ_i.

    Tensors with more than two dimensions are treated as d_out × (product of the rest). Inputs equal to
    the base (τ_i = 0) carry no information and are left out. ``noise_variance`` holds the mean
    per-coordinate DP noise variance s_i² of each input (DP-calibrated widths), or None.
    """
    dtype = torch.float64 if base.dtype == torch.float64 else torch.float32
    base_c = base.to(dtype)
    taus = torch.empty(len(finetuned), *base.shape, dtype=dtype, device=base.device)
    for tau, tensor in zip(taus, finetuned):
        torch.sub(tensor.to(dtype), base_c, out=tau)
    if base.ndim < 2:
        return torch.add(base_c, taus.sum(dim=0), alpha=lam).to(base.dtype)
    taus = taus.reshape(len(finetuned), base.shape[0], -1)
    norms2 = torch.linalg.vector_norm(taus.reshape(len(finetuned), -1), dim=1).square()
    keep = norms2 != 0  # NaN stays in, to be reported
    if not bool(keep.any()):
        return base.clone()
    if not bool(keep.all()):
        taus, norms2 = taus[keep], norms2[keep]
    variance = torch.zeros(len(finetuned), dtype=dtype) if noise_variance is None else torch.tensor(noise_variance)
    gamma2 = norms2 * (tol + taus.shape[2] * variance.to(dtype=dtype, device=taus.device)[keep])
    zeta = cauchy_poe_delta(taus, gamma2, jitter, max_iter, conv_tol, name=name)
    return torch.add(base_c, zeta.reshape(base.shape), alpha=lam).to(base.dtype)
