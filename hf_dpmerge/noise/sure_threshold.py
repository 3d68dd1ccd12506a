"""SURE-optimal soft thresholding of a noisy task vector (Donoho & Johnstone 1995, SureShrink).

For x = θ + ε with ε_k ~ N(0, s_k²), soft thresholding at t·s_k, x̂_k = sign(x_k)·max(|x_k| − t·s_k, 0), has
Stein's unbiased risk estimate, with z_k = x_k/s_k,

    SURE(t) = Σ_k s_k²·[1 − 2·1{|z_k| ≤ t} + min(z_k², t²)],

minimised here over the grid t_g = g·Δ, g = 0…``grid``, of [0, √(2 ln n)] (the universal threshold bounds
it). Every grid value is evaluated at once from per-bucket sums, the bucket of |z_k| being ⌈|z_k|/Δ⌉
(O(n), no sort; accumulated in float64 over chunks, so scratch memory stays small). Coordinates with
s_k = 0 are kept as they are; all-zero noise returns x unchanged.
"""

from __future__ import annotations

import math

import torch

_GRID = 256
_CHUNK = 1 << 22


def _bucket_sums(
    x: torch.Tensor, scale: torch.Tensor, step: float, grid: int
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Per-bucket Σw and Σw·min(|z|, t_max)² (w = s² for a per-coordinate scale, else 1), and Σw."""
    weights = torch.zeros(grid + 2, dtype=torch.float64, device=x.device)
    squares = torch.zeros(grid + 2, dtype=torch.float64, device=x.device)
    flat, flat_scale = x.reshape(-1), scale.reshape(-1)
    for start in range(0, flat.numel(), _CHUNK):
        chunk = flat[start : start + _CHUNK].abs()
        if scale.ndim == 0:
            magnitude, weight = chunk.div_(scale), None
        else:
            part = flat_scale[start : start + _CHUNK]
            magnitude, weight = torch.where(part > 0, chunk / part, math.inf), part.double().square()
        bucket = torch.ceil(magnitude / step).clamp_(max=grid + 1).long()
        capped = magnitude.clamp_(max=grid * step).double().square_()
        weights += torch.bincount(bucket, weights=weight, minlength=grid + 2)
        squares += torch.bincount(bucket, weights=capped if weight is None else capped * weight, minlength=grid + 2)
    return weights, squares, float(weights.sum())


def sure_soft_threshold(x: torch.Tensor, variance: torch.Tensor | float, grid: int = _GRID) -> torch.Tensor:
    """x soft-thresholded at t*·s, t* the grid minimiser of SURE; ``variance`` is a scalar or shaped like x."""
    variance = torch.as_tensor(variance, dtype=torch.float32, device=x.device)
    if not bool((variance > 0).any()):
        return x
    work = x.float()
    scale = variance.sqrt()
    step = math.sqrt(2.0 * math.log(max(x.numel(), 2))) / grid
    weights, squares, total = _bucket_sums(work, scale, step, grid)
    below_w = weights[: grid + 1].cumsum(0)  # |z| <= t_g exactly for buckets 0..g
    below_wz2 = squares[: grid + 1].cumsum(0)
    t2 = (torch.arange(grid + 1, dtype=torch.float64, device=x.device) * step).square()
    risk = total - 2 * below_w + below_wz2 + t2 * (total - below_w)
    threshold = float(torch.argmin(risk)) * step
    if scale.ndim == 0:
        return torch.nn.functional.softshrink(work, threshold * float(scale)).to(x.dtype)
    return (torch.sign(work) * (work.abs() - threshold * scale).clamp_(min=0)).to(x.dtype)
