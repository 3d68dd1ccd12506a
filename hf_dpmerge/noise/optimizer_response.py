"""How much of the per-step DP gradient noise an optimizer leaves in a parameter's final value (docs/design.md §6).

DP-SGD hands the optimizer g_t = μ_t + n_t per coordinate, n_t ~ N(0, σ_g²), σ_g = σ·C/B_exp; s² = Var(p_T).
SGD (momentum, dampening, Nesterov, coupled weight decay) is linear in the gradients, so exactly
s² = σ_g²·Σ_s w_s², w_s the impulse response of p_T to step s (:func:`sgd_impulse_weights`). For Adam(W) the step
m̂/(√v̂ + ε) is a ratio of noisy averages, so s² = S(r) depends on the signal-to-noise ratio r = |μ|/σ_g: a seeded
Monte Carlo of the exact recursion at the run's η_t and hyper-parameters (:func:`adam_variance_curve`), read at
r̂² = max(v̂/σ_g² − 1, 0) from the shipped second moment. A known restoring force h·p (the alignment penalty's
curvature) adds to SGD's weight decay and, for Adam, indexes a second grid axis (:func:`adam_variance_surface`).
The data's own curvature is not modelled, so both are upper bounds.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch

_GRID = 97  # r on u = r/(1 + r) uniform in [0, 0.96]: r from 0 to 24, dense near 0
# the (r, h) surface: r on 49 points of the same range; the per-step damping x = h·η̄/σ_g on 16 points,
# x = x₀·(e^u − 1) with u uniform (0, then geometric-like from 0.005 to 10); 2048 repeats
_SURFACE_RATIOS, _DAMPINGS, _SURFACE_REPEATS, _DAMPING_X0, _DAMPING_MAX = 49, 16, 2048, 0.005, 10.0
_REPEATS = 4096
_SEED = 0


def sgd_impulse_weights(
    lrs: Sequence[float], momentum: float = 0.0, dampening: float = 0.0, nesterov: bool = False,
    weight_decay: float = 0.0,
) -> torch.Tensor:
    """w_s = ∂p_T/∂g_s for torch.optim.SGD's recursion (float64, one entry per step)."""
    steps = len(lrs)
    param = torch.zeros(steps, dtype=torch.float64)
    buffer = torch.zeros(steps, dtype=torch.float64)
    for t, lr in enumerate(lrs):
        grad = weight_decay * param
        grad[t] += 1.0
        if momentum:
            buffer = grad.clone() if t == 0 else momentum * buffer + (1 - dampening) * grad
            grad = grad + momentum * buffer if nesterov else buffer
        param = param - lr * grad
    return -param


def sgd_variance(
    lrs: Sequence[float], noise_std: float, restoring: torch.Tensor | float = 0.0, weight_decay: float = 0.0,
    **hyper: float,
) -> torch.Tensor | float:
    """s² = σ_g²·Σ_s w_s² for SGD (momentum, dampening, nesterov, weight_decay as torch.optim.SGD); a restoring
    force h·p (a scalar or a map) acts as extra coupled weight decay, one impulse response per distinct h."""
    restoring = torch.as_tensor(restoring, dtype=torch.float64)
    values, index = torch.unique(restoring, return_inverse=True)
    responses = torch.tensor([
        noise_std**2 * float(sgd_impulse_weights(lrs, weight_decay=weight_decay + float(h), **hyper).square().sum())
        for h in values.tolist()], dtype=torch.float64)
    variance = responses[index]
    return float(variance) if variance.dim() == 0 else variance.float()


def _simulate_adamw(
    lrs: Sequence[float], noise_std: float, betas: tuple[float, float], eps: float, weight_decay: float,
    signal: torch.Tensor, restoring: torch.Tensor, repeats: int = _REPEATS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(Var(p_T), mean of the final bias-corrected v̂) over ``repeats`` seeded runs of AdamW (decoupled decay, bias
    correction) whose gradients are σ_g·(r + z_t) + h·p_t, for every (r, h) pair of the broadcast ``signal``
    (σ_g·r) and ``restoring`` (h)."""
    beta1, beta2 = betas
    shape = torch.broadcast_shapes(signal.shape, restoring.shape)
    # a fixed seed makes the model deterministic; torch.optim.Adam's coupled L2 decay is simulated as decoupled, a
    # small difference at the usual decays
    generator = torch.Generator().manual_seed(_SEED)
    param = torch.zeros(*shape, repeats, dtype=torch.float64)
    first = torch.zeros_like(param)
    second = torch.zeros_like(param)
    signal, restoring = signal.unsqueeze(-1), restoring.unsqueeze(-1)
    for step, lr in enumerate(lrs, start=1):
        grad = (param * restoring).add_(signal).add_(torch.randn(param.shape, generator=generator,
                                                                 dtype=torch.float64).mul_(noise_std))
        param.mul_(1 - lr * weight_decay)
        first.lerp_(grad, 1 - beta1)
        second.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denominator = (second / (1 - beta2**step)).sqrt_().add_(eps)
        param.addcdiv_(first, denominator, value=-lr / (1 - beta1**step))
    return param.var(dim=-1), second.mean(dim=-1) / (1 - beta2 ** len(lrs))


def _ratio_grid(points: int = _GRID) -> torch.Tensor:
    u = torch.linspace(0.0, 0.96, points, dtype=torch.float64)
    return u / (1 - u)


@functools.lru_cache(maxsize=32)
def adam_variance_curve(
    lrs: tuple[float, ...], noise_std: float, betas: tuple[float, float], eps: float, weight_decay: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(r grid, S(r)): Var(p_T) of AdamW (decoupled decay, bias correction) with gradients σ_g·(r + z_t)."""
    ratio = _ratio_grid()
    return ratio, _simulate_adamw(lrs, noise_std, betas, eps, weight_decay, ratio * noise_std,
                                  torch.zeros(1, dtype=torch.float64))[0]


@functools.lru_cache(maxsize=32)
def adam_variance_surface(
    lrs: tuple[float, ...], noise_std: float, betas: tuple[float, float], eps: float, weight_decay: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(r̂ table, h grid, S table): as :func:`adam_variance_curve` with a restoring force h·p_t added to every
    gradient, h = x·σ_g/η̄ on a grid of the per-step damping x (η̄ the mean η_t). The pull also cancels part of
    the signal, so each cell is indexed by what a run reports, r̂² = v̂/σ_g² − 1 from its final v̂ (made
    non-decreasing in r per column), not by the r it was simulated at."""
    ratio = _ratio_grid(_SURFACE_RATIOS)
    u = torch.linspace(0.0, math.log1p(_DAMPING_MAX / _DAMPING_X0), _DAMPINGS, dtype=torch.float64)
    restoring = _DAMPING_X0 * torch.expm1(u) * noise_std / (sum(lrs) / len(lrs))
    surface, second_moment = _simulate_adamw(lrs, noise_std, betas, eps, weight_decay,
                                             (ratio * noise_std).unsqueeze(1), restoring.unsqueeze(0),
                                             repeats=_SURFACE_REPEATS)
    observed = (second_moment / noise_std**2 - 1).clamp_(min=0).sqrt_().cummax(dim=0).values
    observed = observed + 1e-9 * torch.arange(len(ratio), dtype=torch.float64).unsqueeze(1)  # strictly increasing
    return observed, restoring, surface


def adam_variance(
    second_moment: torch.Tensor, lrs: Sequence[float], noise_std: float, betas: Sequence[float], eps: float,
    weight_decay: float = 0.0, restoring: torch.Tensor | float = 0.0,
) -> torch.Tensor:
    """Per-coordinate s² = S(r̂, h) for Adam(W), r̂² = max(v̂/σ_g² − 1, 0) from the bias-corrected v̂ and h the
    restoring force on the coordinate (a scalar or a map broadcast to ``second_moment``; h beyond the grid is
    clamped to its end, which over-states s²)."""
    if noise_std == 0 or not lrs:
        return torch.zeros_like(second_moment, dtype=torch.float32)
    key = (tuple(float(lr) for lr in lrs), float(noise_std), (float(betas[0]), float(betas[1])), float(eps),
           float(weight_decay))
    moment = second_moment.double().cpu()
    ratio = (moment / noise_std**2 - 1).clamp_(min=0).sqrt_()
    restoring = torch.as_tensor(restoring, dtype=torch.float64).cpu().expand_as(moment)
    if not bool(restoring.any()):
        grid, curve = adam_variance_curve(*key)
        variance = _interpolate(ratio.clamp_(max=float(grid[-1])), grid, curve)
    else:
        observed, damping, surface = adam_variance_surface(*key)
        scale = float(damping[1]) / math.expm1(math.log1p(_DAMPING_MAX / _DAMPING_X0) / (_DAMPINGS - 1))
        # log S along each h column at the coordinate's r̂, then linear in log(1 + h/h₀) across the columns
        flat_ratio = ratio.reshape(-1)
        columns = torch.stack([
            _interpolate(flat_ratio.clamp(float(observed[0, j]), float(observed[-1, j])),
                         observed[:, j].contiguous(), surface[:, j].log())
            for j in range(len(damping))], 1)
        position = torch.log1p(restoring.reshape(-1).clamp(min=0, max=float(damping[-1])) / scale)
        grid = torch.log1p(damping / scale)
        upper = torch.searchsorted(grid, position).clamp_(1, len(grid) - 1)
        weight = ((position - grid[upper - 1]) / (grid[upper] - grid[upper - 1])).unsqueeze(1)
        rows = torch.arange(len(position))
        variance = torch.lerp(columns[rows, upper - 1].unsqueeze(1), columns[rows, upper].unsqueeze(1), weight)
        variance = variance.exp().reshape(moment.shape)
    return variance.float().to(second_moment.device)


def _interpolate(x: torch.Tensor, grid: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Piecewise-linear interpolation of ``values`` on the increasing ``grid`` at ``x`` (inside the grid)."""
    upper = torch.searchsorted(grid, x.reshape(-1)).clamp_(1, len(grid) - 1)
    lower = upper - 1
    weight = (x.reshape(-1) - grid[lower]) / (grid[upper] - grid[lower])
    return torch.lerp(values[lower], values[upper], weight).reshape(x.shape)
