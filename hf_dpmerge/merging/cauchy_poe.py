"""Cauchy product-of-experts merge of task vectors (Le Van et al., arXiv 2607.01689, §4–5).

Per weight matrix, with task vectors τ_i = W_i − W_0 in torch's d_out×d_in layout, the merged update ζ is
the MAP estimate under a product of Cauchy experts on the directional residuals τ_iᵀ(ζ − τ_i):

    E(ζ) = Σ_i log(γ_i² + ‖τ_iᵀ(ζ − τ_i)‖_F²) + j‖ζ‖_F²,        γ_i² = ‖τ_i‖_F²·(tol + d_in·s_i²)

(s_i² = 0 gives the paper's γ_i² = tol·‖τ_i‖²; s_i² > 0 is the DP-calibrated width, DESIGN-NOTES §5).
log is concave, so E is majorised by a quadratic at the current iterate; minimising it gives the MM/IRLS
fixed point (§5, Algorithm 1), started from α ≡ 1:

    α_i = 1 / (γ_i² + ‖τ_iᵀ(ζ − τ_i)‖_F²),     ζ ← (Σ_i α_i τ_iτ_iᵀ + jI)⁻¹ Σ_i α_i τ_iτ_iᵀτ_i

E never increases along the iterates. The output is W_0 + λζ.

Exact low-rank path: every iterate lies in the span of the task vectors' columns. With an orthonormal
basis U (d_out×k) of that span and c_i = Uᵀτ_i, the same iteration on c_i gives z with ζ = Uz, the same
residual norms ‖c_iᵀ(z − c_i)‖ and the same energy, at O(k³ + k²·d_in) per iteration instead of
O(d_out³ + d_out²·d_in) (k ≤ N·r for LoRA deltas).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence

import torch

_SKETCH_START = 64
_BASIS_RTOL = 1e-4
_JITTER_RETRIES = 3


def cauchy_energy(zeta: torch.Tensor, taus: torch.Tensor, gamma2: torch.Tensor, jitter: float) -> float:
    """E(ζ) straight from its definition (taus: N×d_out×d_in, gamma2: N)."""
    residuals = torch.stack([(tau.T @ (zeta - tau)).square().sum() for tau in taus])
    return float(torch.log(gamma2 + residuals).sum() + jitter * zeta.square().sum())


def _cholesky(system: torch.Tensor, jitter: float, name: str) -> torch.Tensor:
    """Cholesky factor of ``system``; on failure add more jitter (×10, up to 3 times), then raise."""
    extra = 0.0
    eye = torch.eye(system.shape[0], dtype=system.dtype, device=system.device)
    for attempt in range(_JITTER_RETRIES + 1):
        factor, info = torch.linalg.cholesky_ex(system + extra * eye)
        if int(info) == 0:
            if extra:
                warnings.warn(f"cauchy_poe: {name}: Cholesky needed extra jitter {extra:.3g}", stacklevel=3)
            return factor
        extra = max(jitter, 1e-12) * 10 ** (attempt + 1)
    raise ValueError(
        f"cauchy_poe: {name}: Cholesky of Σα_iτ_iτ_iᵀ + jI failed even with jitter {extra:.3g}; "
        f"the task vectors may hold inf/NaN or the matrix is too ill-conditioned (raise `jitter`)"
    )


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
    """
    grams = taus @ taus.transpose(1, 2)
    targets = grams @ taus
    constant = grams.square().sum(dim=(1, 2))
    identity = torch.eye(taus.shape[1], dtype=taus.dtype, device=taus.device)
    alpha = torch.ones_like(gamma2)
    previous = None
    for _ in range(max_iter):
        system = torch.einsum("n,nij->ij", alpha, grams) + jitter * identity
        rhs = torch.einsum("n,nij->ij", alpha, targets)
        zeta = torch.cholesky_solve(rhs, _cholesky(system, jitter, name))
        yield zeta
        if previous is not None and float(torch.linalg.norm(zeta - previous)) < conv_tol:
            return
        outer = zeta @ zeta.T
        residual = (grams * outer).sum(dim=(1, 2)) - 2 * (targets * zeta).sum(dim=(1, 2)) + constant
        alpha = 1.0 / (gamma2 + residual.clamp_min(0))
        previous = zeta


def thin_basis(taus: torch.Tensor, rtol: float = _BASIS_RTOL) -> torch.Tensor | None:
    """Orthonormal U (d_out×k) whose span holds every τ_i to ``rtol`` relative error, or None.

    None means k would exceed d_out/2, where the dense solve costs about as much. When N·d_in ≤ d_out/2,
    U comes from a QR of the stacked task vectors. Otherwise from the QR of a Gaussian sketch Σ_i τ_iΩ_i
    of doubling width (64, 128, …, d_out/2): a sketch of full numerical rank (every |R_jj| > rtol·max|R_jj|) means
    the span is wider still; a rank-deficient one is accepted once ‖τ_i − UUᵀτ_i‖_F ≤ rtol·‖τ_i‖_F for
    every i. Extra columns outside the span are harmless: the solution has no component along them.
    """
    count, rows, cols = taus.shape
    limit = rows // 2
    stacked = taus.permute(1, 0, 2).reshape(rows, count * cols)
    if count * cols <= limit:
        return torch.linalg.qr(stacked).Q
    generator = torch.Generator(device=taus.device).manual_seed(0)
    sketch = taus.new_empty(rows, 0)
    norms = torch.linalg.norm(taus.reshape(count, -1), dim=1)
    width = min(_SKETCH_START, limit)
    while width > 0:
        omega = torch.randn(
            count * cols, width - sketch.shape[1], generator=generator, dtype=taus.dtype, device=taus.device
        )
        sketch = torch.cat([sketch, stacked @ omega], dim=1)
        basis, upper = torch.linalg.qr(sketch)
        diagonal = upper.diagonal().abs()
        if bool(diagonal.min() <= rtol * diagonal.max()):
            error = torch.linalg.norm((stacked - basis @ (basis.T @ stacked)).reshape(rows, count, cols), dim=(0, 2))
            if bool((error <= rtol * norms).all()):
                return basis
        width = min(2 * width, limit) if width < limit else 0
    return None


def cauchy_poe_delta(
    taus: torch.Tensor,
    gamma2: torch.Tensor,
    jitter: float,
    max_iter: int,
    conv_tol: float,
    low_rank: bool = True,
    name: str = "tensor",
) -> torch.Tensor:
    """The converged ζ for N×d_out×d_in task vectors, on the thin basis when ``low_rank`` and one exists.

    The basis is found in the inputs' precision; the iteration runs in float64, because the system
    Σα_iτ_iτ_iᵀ + jI grows ill-conditioned (α_i ≈ 1/γ_i² ≫ j) and float32 iterates would wander.
    """
    basis = thin_basis(taus) if low_rank else None
    coords = (taus if basis is None else basis.T @ taus).double()
    zeta = coords[0]
    for zeta in fixed_point_iterates(coords, gamma2.double(), jitter, max_iter, conv_tol, name):
        pass
    return zeta.to(taus.dtype) if basis is None else basis @ zeta.to(taus.dtype)


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
    taus = torch.stack([tensor.to(dtype) - base_c for tensor in finetuned])
    if base.ndim < 2:
        return (base_c + lam * taus.sum(dim=0)).to(base.dtype)
    taus = taus.reshape(len(finetuned), base.shape[0], -1)
    norms2 = taus.square().sum(dim=(1, 2))
    keep = norms2 > 0
    if not bool(keep.any()):
        return base.clone()
    variance = torch.zeros_like(norms2) if noise_variance is None else torch.tensor(noise_variance, dtype=dtype)
    gamma2 = norms2[keep] * (tol + taus.shape[2] * variance.to(taus.device)[keep])
    zeta = cauchy_poe_delta(taus[keep], gamma2, jitter, max_iter, conv_tol, name=name)
    return (base_c + lam * zeta.reshape(base.shape)).to(base.dtype)
