"""SURE-optimal linear shrinkage of a noisy task vector: positive-part James–Stein (docs/design.md §6).

For x = θ + ε, ε_k ~ N(0, v_k) independent, the scaled estimate c·x has Stein's unbiased risk estimate

    SURE(c) = (1 − c)²·‖x‖² + (2c − 1)·Σ_k v_k,

minimised at c* = 1 − Σ_k v_k/‖x‖², clipped to [0, 1]:

    θ̂ = max(0, 1 − Σ_k v_k/‖x‖²)·x        (n·v/‖x‖² for a scalar variance v).

With a scalar variance this is the positive-part James–Stein estimator with constant n (James & Stein 1961;
Baranchik 1970): for n ≥ 5 (0 < n < 2(n − 2)) its expected squared error is below the raw x's, n·v, for
every θ, dense or sparse. It never zeroes a clean input (v = 0 gives c = 1, θ̂ = x exactly).
"""

from __future__ import annotations

import torch


def sure_scale(x: torch.Tensor, variance: torch.Tensor | float) -> torch.Tensor:
    """c*·x with c* = max(0, 1 − Σ_k v_k/‖x‖²); ``variance`` is a scalar or shaped like x; x itself when v = 0."""
    variance = torch.as_tensor(variance, dtype=torch.float64, device=x.device)
    total = float(variance.expand(x.shape).sum()) if variance.ndim else float(variance) * x.numel()
    if total <= 0:
        return x
    energy = float(x.double().square().sum())
    scale = max(0.0, 1.0 - total / energy) if energy > 0 else 0.0
    return (x.float() * scale).to(x.dtype)
