"""SURE-optimal soft thresholding of a noisy task vector (Donoho & Johnstone 1995, SureShrink).

For x = θ + ε with ε_k ~ N(0, s_k²), soft thresholding at t·s_k, x̂_k = sign(x_k)·max(|x_k| − t·s_k, 0), has
Stein's unbiased risk estimate, with z_k = x_k/s_k,

    SURE(t) = Σ_k s_k²·[1 − 2·1{|z_k| ≤ t} + min(z_k², t²)],

minimised here over a grid of ``grid`` + 1 points of [0, √(2 ln n)] (the universal threshold bounds it).
Every grid value is evaluated at once from per-bucket sums (O(n log grid), no sort). Coordinates with
s_k = 0 are kept as they are; all-zero noise returns x unchanged.
"""

from __future__ import annotations

import math

import torch

_GRID = 256


def sure_soft_threshold(x: torch.Tensor, variance: torch.Tensor | float, grid: int = _GRID) -> torch.Tensor:
    """x soft-thresholded at t*·s, t* the grid minimiser of SURE; ``variance`` broadcasts to x."""
    variance = torch.as_tensor(variance, dtype=torch.float32, device=x.device).expand(x.shape)
    if not bool((variance > 0).any()):
        return x
    work = x.float()
    scale = variance.sqrt()
    magnitude = torch.where(scale > 0, work.abs() / scale, torch.full_like(work, math.inf)).flatten()
    weight = variance.flatten().double()
    limit = math.sqrt(2.0 * math.log(max(x.numel(), 2)))
    thresholds = torch.linspace(0.0, limit, grid + 1, dtype=torch.float32, device=x.device)
    # bucket b holds |z| in (t_{b-1}, t_b]; |z| <= t_g exactly for buckets 0..g
    bucket = torch.bucketize(magnitude, thresholds)
    below_w = torch.bincount(bucket, weights=weight, minlength=grid + 2)[: grid + 1].cumsum(0)
    capped = torch.minimum(magnitude, thresholds[-1]).double().square() * weight
    below_wz2 = torch.bincount(bucket, weights=capped, minlength=grid + 2)[: grid + 1].cumsum(0)
    total = weight.sum()
    t2 = thresholds.double().square()
    risk = total - 2 * below_w + below_wz2 + t2 * (total - below_w)
    best = thresholds[int(torch.argmin(risk))]
    shrunk = torch.sign(work) * torch.clamp(work.abs() - best * scale, min=0)
    return shrunk.to(x.dtype)
