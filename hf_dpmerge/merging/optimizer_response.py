"""How much of the per-step DP gradient noise an optimizer leaves in a parameter's final value (docs/design.md §6).

DP-SGD hands the optimizer g_t = μ_t + n_t per coordinate, n_t ~ N(0, σ_g²) independent across steps and
coordinates, σ_g = σ·C/B_exp (opacus: noise N(0, σ²C²) on the clipped sum, divided by the expected batch).
The released value p_T = p_0 + τ; its noise variance s² = Var(p_T) over the noise draws:

* SGD with momentum μ, dampening d, Nesterov, coupled weight decay λ: the recursion is linear in the
  gradients, so p_T = const + Σ_s w_s·n_s exactly, and s² = σ_g²·Σ_s w_s²; w_s is the response of p_T to a
  unit impulse at step s (:func:`sgd_impulse_weights`; Σ_t η_t² when μ = λ = 0, ≈ Σ_t η_t²/(1 − μ)² only
  when the momentum tail has died out).
* Adam / AdamW (β1, β2, ε, decoupled decay λ, bias correction): the update m̂_t/(√v̂_t + ε) is a ratio of
  noisy averages, so s² depends on the per-step signal-to-noise ratio r = |μ|/σ_g (simulated, AdamW 40
  steps: 1.25·Ση² at r = 0, 0.78 at r = 0.5, 0.30 at r = 1, 0.05 at r = 2). :func:`adam_variance_curve`
  computes S(r) = Var(p_T) on a grid of r by Monte Carlo of the exact recursion at the run's own η_t
  schedule and hyper-parameters (fixed seed, so the model is deterministic; torch.optim.Adam's coupled L2
  decay is simulated as decoupled, a small difference at the usual decays); a coordinate's r is
  estimated from the optimizer's bias-corrected second moment v̂ = E[g²] ≈ μ² + σ_g², shipped with the
  adapter (:mod:`hf_dpmerge.records.noise_stats`): r̂² = max(v̂/σ_g² − 1, 0).

Curvature damps the walk, so both are upper bounds for parameters the loss pulls back.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

_GRID = 97  # r on u = r/(1 + r) uniform in [0, 0.96]: r from 0 to 24, dense near 0
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


def sgd_variance(lrs: Sequence[float], noise_std: float, **hyper: float) -> float:
    """s² = σ_g²·Σ_s w_s² for SGD (momentum, dampening, nesterov, weight_decay as torch.optim.SGD)."""
    return noise_std**2 * float(sgd_impulse_weights(lrs, **hyper).square().sum())


@functools.lru_cache(maxsize=32)
def adam_variance_curve(
    lrs: tuple[float, ...], noise_std: float, betas: tuple[float, float], eps: float, weight_decay: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(r grid, S(r)): Var(p_T) of AdamW (decoupled decay, bias correction) with gradients σ_g·(r + z_t)."""
    beta1, beta2 = betas
    u = torch.linspace(0.0, 0.96, _GRID, dtype=torch.float64)
    ratio = u / (1 - u)
    generator = torch.Generator().manual_seed(_SEED)
    param = torch.zeros(_GRID, _REPEATS, dtype=torch.float64)
    first = torch.zeros_like(param)
    second = torch.zeros_like(param)
    signal = (ratio * noise_std).unsqueeze(1)
    for step, lr in enumerate(lrs, start=1):
        grad = torch.randn(_GRID, _REPEATS, generator=generator, dtype=torch.float64).mul_(noise_std).add_(signal)
        param.mul_(1 - lr * weight_decay)
        first.lerp_(grad, 1 - beta1)
        second.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denominator = (second / (1 - beta2**step)).sqrt_().add_(eps)
        param.addcdiv_(first, denominator, value=-lr / (1 - beta1**step))
    return ratio, param.var(dim=1)


def adam_variance(
    second_moment: torch.Tensor, lrs: Sequence[float], noise_std: float, betas: Sequence[float], eps: float,
    weight_decay: float = 0.0,
) -> torch.Tensor:
    """Per-coordinate s² = S(r̂) for Adam(W), r̂² = max(v̂/σ_g² − 1, 0) from the bias-corrected v̂."""
    if noise_std == 0:
        return torch.zeros_like(second_moment, dtype=torch.float32)
    grid, curve = adam_variance_curve(
        tuple(float(lr) for lr in lrs), float(noise_std), (float(betas[0]), float(betas[1])), float(eps),
        float(weight_decay),
    )
    ratio = (second_moment.double().cpu() / noise_std**2 - 1).clamp_(min=0).sqrt_().clamp_(max=float(grid[-1]))
    return _interpolate(ratio, grid, curve).float().to(second_moment.device)


def _interpolate(x: torch.Tensor, grid: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Piecewise-linear interpolation of ``values`` on the increasing ``grid`` at ``x`` (inside the grid)."""
    upper = torch.searchsorted(grid, x.reshape(-1)).clamp_(1, len(grid) - 1)
    lower = upper - 1
    weight = (x.reshape(-1) - grid[lower]) / (grid[upper] - grid[lower])
    return torch.lerp(values[lower], values[upper], weight).reshape(x.shape)
