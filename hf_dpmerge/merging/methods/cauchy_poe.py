"""Cauchy product-of-experts merge of task vectors (Le Van et al., arXiv 2607.01689, §4–5).

Per weight matrix, with task vectors τ_i = W_i − W_0 (d_out×d_in), the merged update ζ minimises

    E(ζ) = Σ_i log(γ_i² + ‖τ_iᵀ(ζ − τ_i)‖_F²) + j‖ζ‖_F²,        γ_i² = ‖τ_i‖_F²·(tol + d_in·s_i²)

by the MM/IRLS fixed point α_i = 1/(γ_i² + ‖τ_iᵀ(ζ − τ_i)‖_F²), ζ ← (Σ_i α_i τ_iτ_iᵀ + jI)⁻¹ Σ_i α_i τ_iτ_iᵀτ_i
(Anderson-accelerated on log α, E never increasing), and the output is W_0 + λζ. s_i² > 0 is the DP-calibrated
width. ``layers``: ``reference`` (the paper's code: tall matrices by d_in×d_in row blocks, wide ones, embeddings
and 1-D tensors by λ·mean) or ``whole``. The iteration runs exactly in the span of the task vectors (from the
LoRA factors when every input is one) or in the dual space. See docs/design.md §5.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Literal

import torch

from hf_dpmerge.merging.methods.spectral import is_embedding

_SKETCH_START = 64
_BASIS_RTOL = 1e-4
_JITTER_RETRIES = 3
_ANDERSON_MEMORY = 5
_MAX_LOG_STEP = 2.0
_FLOAT32_MIN_CONV_TOL = 1e-6  # the smallest relative change of α a float32 solve resolves (measured: ≤ 1e-7)
_FLOAT32_MAX_ITER = 100  # a float32 run not converged by then is redone in float64


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


def _mm_iterates(
    solve: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    gamma2: torch.Tensor,
    jitter: float,
    max_iter: int,
    conv_tol: float,
    name: str,
    accelerate: bool,
    energy_rtol: float = 1e-12,
    warn: bool = True,
    start: torch.Tensor | None = None,
) -> Generator[torch.Tensor, None, bool]:
    """The accepted iterates of the MM fixed point on α, from α ≡ 1 (or ``start``); returns whether it converged.

    ``solve(α)`` returns (ζ(α), the residuals ‖τ_iᵀ(ζ − τ_i)‖², ‖ζ‖²). The plain MM step is α ← g(α) =
    1/(γ² + residuals). With ``accelerate``, Anderson mixing (memory 5) extrapolates log α from the last
    steps; an extrapolated α whose ζ raises E (by more than ``energy_rtol``·|E|, the rounding of E) is
    rejected and replaced by the plain MM step from the last accepted iterate, so E never increases along
    the yielded iterates (a plain step lowers E by construction and is always accepted). Stops when the
    relative change of α, max_i |g(α)_i − α_i|/g(α)_i, falls below ``conv_tol``; after ``max_iter`` solves
    without that it warns (unless ``warn`` is off), naming the tensor and the last relative change.
    """
    alpha = torch.ones_like(gamma2) if start is None else start.to(gamma2)
    accepted_energy, fallback, extrapolated = math.inf, alpha, False
    steps: list[torch.Tensor] = []
    images: list[torch.Tensor] = []
    change = math.inf
    for _ in range(max_iter):
        zeta, residual, norm2 = solve(alpha)
        residual = residual.clamp_min(0)
        energy = float(torch.log(gamma2 + residual).sum() + jitter * norm2)
        if extrapolated and energy > accepted_energy + energy_rtol * abs(accepted_energy):  # overshot
            alpha, extrapolated = fallback, False
            steps.clear()
            images.clear()
            continue
        yield zeta
        accepted_energy = energy
        update = 1.0 / (gamma2 + residual)
        change = float(((update - alpha).abs() / update).max())
        if change < conv_tol:
            return True
        fallback = update
        extrapolated = accelerate and bool(steps)  # _anderson extrapolates from the second step on
        alpha = _anderson(alpha.log(), update.log(), steps, images).exp() if accelerate else update
    if warn and change >= conv_tol > 0:
        warnings.warn(
            f"cauchy_poe: {name}: stopped at max_iter={max_iter} before converging (relative change of α "
            f"{change:.2g} > conv_tol {conv_tol:g}); raise max_iter",
            stacklevel=3,
        )
    return change < conv_tol


def _anderson(point: torch.Tensor, image: torch.Tensor, points: list[torch.Tensor], images: list[torch.Tensor],
              memory: int = _ANDERSON_MEMORY) -> torch.Tensor:
    """Anderson (type II) extrapolation of the fixed point of x ↦ g(x) from the history (updated in place)."""
    points.append(point)
    images.append(image)
    del points[:-memory - 1], images[:-memory - 1]
    if len(points) < 2:
        return image
    residuals = torch.stack([g - x for x, g in zip(points, images)], dim=1)
    d_residual = residuals.diff(dim=1)
    d_image = torch.stack(images, dim=1).diff(dim=1)
    normal = d_residual.T @ d_residual
    normal.diagonal().add_(1e-10 * float(normal.diagonal().sum()) + 1e-300)  # Tikhonov: histories turn collinear
    weights = torch.linalg.solve(normal, d_residual.T @ residuals[:, -1:])
    extrapolated = image - (d_image @ weights).squeeze(1)
    # a step more than a factor e^_MAX_LOG_STEP from the plain MM update is not trusted
    if not bool(torch.isfinite(extrapolated).all()):
        return image
    return extrapolated.clamp(image - _MAX_LOG_STEP, image + _MAX_LOG_STEP)


def fixed_point_iterates(
    taus: torch.Tensor,
    gamma2: torch.Tensor,
    jitter: float,
    max_iter: int,
    conv_tol: float,
    name: str = "tensor",
    accelerate: bool = True,
    dtype: torch.dtype = torch.float64,
    warn: bool = True,
    start: torch.Tensor | None = None,
) -> Generator[torch.Tensor, None, bool]:
    """Yield the iterates ζ_1, ζ_2, … of :func:`_mm_iterates` in the primal (m×m) form, from α ≡ 1 or
    ``start``; return whether it converged.

    ``taus`` is N×m×d_in in any orthonormal coordinates of the column space (m = d_out when dense).
    Residual norms use the Grams: ‖τ_iᵀ(ζ − τ_i)‖² = ⟨G_i, ζζᵀ⟩ − 2⟨G_iτ_i, ζ⟩ + ‖G_i‖², G_i = τ_iτ_iᵀ.
    Grams and solves run in ``dtype``, the residuals and the energy are summed in float64. float64 is the
    default: for nearly rank-deficient inputs (LoRA deltas in a thin basis) the system Σα_iG_i + jI grows
    ill-conditioned (α_i ≈ 1/γ_i² ≫ j) and the residual formula cancels, and float32 leaves α jittering at
    ~1e-3 relative. For full-rank dense blocks float32 converges in as many solves to near the float64 fixed
    point, which :func:`cauchy_poe_delta` then polishes from ``start``; its energy check allows float32 rounding.
    """
    count, rows, _ = taus.shape
    taus = taus.to(dtype)
    grams = torch.bmm(taus, taus.transpose(1, 2))
    targets = torch.bmm(grams, taus).reshape(count, -1)
    grams = grams.reshape(count, -1)
    constant = torch.linalg.vector_norm(grams, dim=1).double().square()  # at the Grams' own precision
    buffer = torch.empty(rows, rows, dtype=dtype, device=taus.device)

    def solve(alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        weights = alpha.to(dtype)

        def fill(system: torch.Tensor, extra: float) -> None:  # Σα_iG_i + (j + extra)I
            torch.mv(grams.T, weights, out=system.view(-1))
            system.diagonal().add_(jitter + extra)

        rhs = (weights @ targets).reshape(rows, -1)
        zeta = torch.cholesky_solve(rhs, _cholesky(fill, buffer, jitter, name))
        flat = zeta.reshape(-1)
        residual = (grams @ (zeta @ zeta.T).reshape(-1)).double() - 2 * (targets @ flat).double() + constant
        return zeta, residual, torch.dot(flat, flat).double()

    energy_rtol = max(1e-12, 100 * torch.finfo(dtype).eps)
    return (yield from _mm_iterates(solve, gamma2.double().to(taus.device), jitter, max_iter, conv_tol, name,
                                    accelerate, energy_rtol, warn, start))


def dual_iterates(
    taus: torch.Tensor,
    gamma2: torch.Tensor,
    jitter: float,
    max_iter: int,
    conv_tol: float,
    name: str = "tensor",
    accelerate: bool = True,
) -> Generator[torch.Tensor, None, bool]:
    """The same iterates as :func:`fixed_point_iterates`, as Y_t with ζ_t = T·Y_t, T = [τ_1 … τ_N] (d_out×n).

    With K = TᵀT (n×n, n = N·d_in), A = diag(α_i·I) and B = [τ_1ᵀτ_1; …; τ_Nᵀτ_N] (the diagonal blocks
    of K), the push-through identity gives (TATᵀ + jI)⁻¹·TAB = T·(K + jA⁻¹)⁻¹·B, so Y = (K + jA⁻¹)⁻¹B;
    the residuals are the blocks τ_iᵀ(ζ − τ_i) = (KY − B)_i (no cancellation) and ‖ζ‖² = tr(YᵀKY).
    It needs no d_out×d_out matrix: cheaper and lighter when n < d_out (tall matrices merged whole).
    """
    count, _, cols = taus.shape
    kernel = torch.empty(count * cols, count * cols, dtype=torch.float64, device=taus.device)
    for i in range(count):
        for j in range(i, count):
            block = taus[i].double().T @ taus[j].double()
            kernel[i * cols : (i + 1) * cols, j * cols : (j + 1) * cols] = block
            kernel[j * cols : (j + 1) * cols, i * cols : (i + 1) * cols] = block.T
    blocks = torch.cat([kernel[i * cols : (i + 1) * cols, i * cols : (i + 1) * cols] for i in range(count)])
    buffer = torch.empty_like(kernel)

    def solve(alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        def fill(system: torch.Tensor, extra: float) -> None:  # K + jA⁻¹ + extra·I
            system.copy_(kernel).diagonal().add_((jitter / alpha).repeat_interleave(cols) + extra)

        coords = torch.cholesky_solve(blocks, _cholesky(fill, buffer, jitter, name))
        image = kernel @ coords
        residual = (image - blocks).reshape(count, cols, cols).square().sum(dim=(1, 2))
        return coords, residual, (coords * image).sum()

    return (yield from _mm_iterates(solve, gamma2.double().to(taus.device), jitter, max_iter, conv_tol, name,
                                    accelerate))


def thin_basis(
    taus: torch.Tensor, rtol: float = _BASIS_RTOL, max_width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(U, C): orthonormal U (d_out×k) and coordinates C (N×k×d_in) with τ_i = U·C_i to ``rtol``, or None.

    U spans a Gaussian sketch Σ_i τ_iΩ_i of width 64, then ``max_width`` (default d_out/2, beyond which
    the dense solve costs about as much). A sketch of full numerical rank (every |R_jj| > rtol·max|R_jj|
    of its QR) means the span may be wider still; in a rank-deficient one the columns with small R_jj are
    dependent and dropped, and U is accepted once ‖τ_i − UUᵀτ_i‖_F ≤ rtol·‖τ_i‖_F for every i. Full
    rank, the common case for full fine-tunes, is recognised by :func:`_full_rank` without the QR, and
    first from limit + 1 random columns of [τ_1 … τ_N]: independent ones prove the span wider than any
    basis allowed, at no matrix product (a dependent draw, as from low-rank τ_i, goes on to the sketches).
    """
    count, rows, cols = taus.shape
    limit = min(rows // 2, max_width or rows)
    generator = torch.Generator(device=taus.device).manual_seed(0)
    if count * cols > limit:
        pick = torch.randperm(count * cols, generator=generator, device=taus.device)[: limit + 1]
        if _full_rank(taus[pick // cols, :, pick % cols].T, rtol):
            return None
    norms = torch.linalg.norm(taus.reshape(count, -1), dim=1)
    for width in sorted({min(_SKETCH_START, limit), limit} - {0}):
        omega = torch.randn(count, cols, width, generator=generator, dtype=taus.dtype, device=taus.device)
        sketch = combine(taus, omega)
        if _full_rank(sketch, rtol):
            continue  # the span may be wider still
        basis, upper = torch.linalg.qr(sketch)
        diagonal = upper.diagonal().abs()
        independent = diagonal > rtol * diagonal.max()
        if bool(independent.all()):
            continue
        basis = basis[:, independent]
        coords = basis.T @ taus
        error = torch.stack([torch.linalg.norm(tau - basis @ coord) for tau, coord in zip(taus, coords)])
        if bool((error <= rtol * norms).all()):
            return basis, coords
    return None


def _full_rank(sketch: torch.Tensor, rtol: float) -> bool:
    """Whether every |R_jj| of the sketch's QR exceeds rtol·max|R_jj|, read off the Cholesky factor of its
    float64 Gram (R = Lᵀ up to signs; accurate to ~1e-8·max|R_jj| ≪ rtol): a Householder QR of a d_out×d_out/2
    float32 sketch cost more than the whole fixed point of a full-rank 768×768 block. A factorisation that
    fails says the Gram is singular, so the sketch is rank-deficient."""
    wide = sketch.double()
    factor, info = torch.linalg.cholesky_ex(wide.T @ wide)
    if int(info):
        return False
    diagonal = factor.diagonal()
    return bool((diagonal > rtol * diagonal.max()).all())


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
    thin: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """The converged ζ for N×d_out×d_in task vectors.

    ``thin`` = (U, C) gives the task vectors as τ_i = U·C_i exactly (from LoRA factors); else, with
    ``low_rank``, the iteration runs in the smallest exact coordinates available: a thin basis of the task
    vectors' span when one is found, else the dual space when N·d_in ≤ d_out; otherwise (and without
    ``low_rank``) densely in d_out×d_out: for float32 (or narrower) inputs with ``conv_tol`` ≥ 1e-6 the fixed
    point is found in float32, then polished in float64 from the α of the float32 ζ, α_i = 1/(γ_i² +
    ‖τ_iᵀ(ζ − τ_i)‖²) with the residuals formed directly in float64 (float32 alone missed 1e-4·max|ζ| when the
    experts nearly agree: 2.4e-4 at spread 1e-3; polished, ≤ 3e-7 after one float64 solve); a float32 run not
    converged after 100 solves is redone in float64 from α ≡ 1. Otherwise in float64.
    """
    count, rows, cols = taus.shape if thin is None else (thin[1].shape[0], thin[0].shape[0], thin[1].shape[2])
    dual = count * cols <= rows
    if thin is None and low_rank:
        thin = thin_basis(taus, max_width=_SKETCH_START if dual else None)
    if thin is not None:
        basis, coords = thin
        zeta = _last(fixed_point_iterates(coords, gamma2, jitter, max_iter, conv_tol, name))
        return basis @ zeta.to(basis.dtype)
    if low_rank and dual:
        coords = _last(dual_iterates(taus, gamma2, jitter, max_iter, conv_tol, name))
        return combine(taus, coords.to(taus.dtype).reshape(count, cols, -1))
    if taus.dtype != torch.float64 and conv_tol >= _FLOAT32_MIN_CONV_TOL:
        zeta, converged = _converged_last(fixed_point_iterates(
            taus, gamma2, jitter, min(max_iter, _FLOAT32_MAX_ITER), conv_tol, name, dtype=torch.float32, warn=False))
        if converged:
            wide = taus.double()
            residual = (wide.transpose(1, 2) @ (zeta.double() - wide)).square().sum(dim=(1, 2))
            start = 1.0 / (gamma2.double().to(residual.device) + residual)
            return _last(fixed_point_iterates(taus, gamma2, jitter, max_iter, conv_tol, name, start=start)).to(
                taus.dtype)
    return _last(fixed_point_iterates(taus, gamma2, jitter, max_iter, conv_tol, name)).to(taus.dtype)


def _converged_last(iterates: Generator[torch.Tensor, None, bool]) -> tuple[torch.Tensor, bool]:
    """The last iterate and the generator's return value (whether it converged)."""
    while True:
        try:
            value = next(iterates)
        except StopIteration as stop:
            return value, stop.value


def _last(iterates: Iterator[torch.Tensor]) -> torch.Tensor:
    for value in iterates:
        pass
    return value


LayerRule = Literal["reference", "whole"]


def averaged_by_rule(name: str, shape: torch.Size, layers: LayerRule) -> bool:
    """Whether the tensor merges as W_0 + λ·mean_i τ_i rather than by PoE.

    Always for 1-D tensors (biases, norms). With the reference rule also for embeddings (names holding
    ``embed``, ``wte`` or ``wpe``) and wide matrices (d_out < d_in); square ones are PoE-merged whole and
    tall ones (d_out > d_in) as d_in×d_in row blocks (:func:`row_blocks`).
    """
    if len(shape) < 2:
        return True
    rows, cols = shape[0], math.prod(shape[1:])
    return layers == "reference" and (is_embedding(name) or rows < cols)


def row_blocks(rows: int, cols: int, layers: LayerRule) -> list[slice]:
    """The row ranges PoE-merged separately: d_in rows each for a tall matrix under the reference rule."""
    if layers == "whole" or rows <= cols:
        return [slice(0, rows)]
    return [slice(start, min(start + cols, rows)) for start in range(0, rows, cols)]


def factor_basis(
    lefts: Sequence[torch.Tensor], rights: Sequence[torch.Tensor], rtol: float = _BASIS_RTOL
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(U, C) with τ_i = L_i·R_i = U·C_i exactly, U an orthonormal basis of the L_i's columns (d_out×k,
    k ≤ Σ rank_i), or None when k > d_out/2 (the dense solve is as cheap)."""
    stacked = torch.cat(list(lefts), dim=1)
    if stacked.shape[1] > stacked.shape[0] // 2:
        return None
    basis, upper = torch.linalg.qr(stacked)
    diagonal = upper.diagonal().abs()
    basis = basis[:, diagonal > rtol * diagonal.max().clamp_min(torch.finfo(diagonal.dtype).tiny)]
    return basis, torch.stack([(basis.T @ left) @ right for left, right in zip(lefts, rights)])


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
    layers: LayerRule = "reference",
    factors: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> torch.Tensor:
    """W_0 + λζ for one tensor, per the layer rule of :func:`averaged_by_rule` (averaged: W_0 + λ·mean τ_i).

    Tensors with more than two dimensions are treated as d_out × (product of the rest). Inputs equal to
    the base (τ_i = 0) carry no information and are left out. ``noise_variance`` holds the mean
    per-coordinate DP noise variance s_i² of each input (DP-calibrated widths), or None. ``factors`` gives
    every input's task vector as L_i·R_i (a LoRA delta, in the weight's layout): τ then comes from the
    factors, exactly, whatever precision the merged inputs were stored in, and the iteration runs in the
    span of the L_i.
    """
    dtype = torch.float64 if base.dtype == torch.float64 else torch.float32
    base_c = base.to(dtype)
    if factors is not None:
        factors = [(left.to(dtype=dtype, device=base.device), right.to(dtype=dtype, device=base.device))
                   for left, right in factors]

    def task_vector(index: int, out: torch.Tensor) -> torch.Tensor:
        if factors is None:
            return torch.sub(finetuned[index].to(dtype), base_c, out=out)
        left, right = factors[index]
        torch.matmul(left, right, out=out.view(left.shape[0], -1))
        return out

    if averaged_by_rule(name, base.shape, layers):  # one task vector at a time: no N copies of an embedding
        total, scratch = torch.zeros_like(base_c), torch.empty_like(base_c)
        for index in range(len(finetuned)):
            total += task_vector(index, scratch)
        return torch.add(base_c, total, alpha=lam / len(finetuned)).to(base.dtype)
    taus = torch.empty(len(finetuned), *base.shape, dtype=dtype, device=base.device)
    for index, tau in enumerate(taus):
        task_vector(index, tau)
    taus = taus.reshape(len(finetuned), base.shape[0], -1)
    variance = torch.zeros(len(finetuned), dtype=dtype) if noise_variance is None else torch.tensor(noise_variance)
    variance = variance.to(dtype=dtype, device=base.device)
    delta = torch.zeros_like(taus[0])
    for rows in row_blocks(taus.shape[1], taus.shape[2], layers):
        block = taus[:, rows]
        norms2 = torch.linalg.vector_norm(block.reshape(len(finetuned), -1), dim=1).square()
        keep = norms2 != 0  # NaN stays in, to be reported
        if not bool(keep.any()):
            continue
        gamma2 = norms2[keep] * (tol + block.shape[2] * variance[keep])
        thin = None
        if factors is not None:
            thin = factor_basis([factors[i][0][rows] for i in range(len(factors)) if keep[i]],
                                [factors[i][1] for i in range(len(factors)) if keep[i]])
        label = name if rows.stop - rows.start == taus.shape[1] else f"{name}[rows {rows.start}:{rows.stop}]"
        delta[rows] = cauchy_poe_delta(block[keep], gamma2, jitter, max_iter, conv_tol, name=label, thin=thin)
    return torch.add(base_c, delta.reshape(base.shape), alpha=lam).to(base.dtype)
