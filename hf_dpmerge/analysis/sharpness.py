"""Sharpness and top Hessian eigenvalue of a task loss at an adapter's weights (DP-Merging §3.2; docs/design.md §1).

- Sharp_t = L_t(w + ρ·∇L_t(w)/‖∇L_t(w)‖) − L_t(w): the loss rise after one SAM ascent step of radius ρ along
  the full-set gradient (the ascent and restore are those of training's SAM step,
  :mod:`hf_dpmerge.modeling.sam_ascent`).
- λ_max(∇²L_t(w)) by power iteration on Hessian-vector products Hv = ∇_w(∇_w L_t(w)·v) (double backward):
  v ← Hv/‖Hv‖ with Rayleigh quotient λ = vᵀHv, until |Δλ| ≤ tol·|λ|. Power iteration finds the eigenvalue of
  largest magnitude λ_dom; when λ_dom < 0, a second run on the positive semi-definite H − λ_dom·I gives
  λ_max = λ_dom + its dominant eigenvalue.

w is the vector of the adapter's trainable parameters (LoRA factors and task head), the space training's
sharpness-aware step perturbs; every other weight stays fixed. Models are used in eval mode (no dropout).
Hessian-vector products run attention through SDPA's math kernel: the fused CPU kernels have no double backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from hf_dpmerge.analysis.batching import Batch
from hf_dpmerge.analysis.task_loss import batch_loss_sum, evaluate_loss, loss_gradient, num_examples
from hf_dpmerge.modeling.sam_ascent import ascent_step, perturbed

Vector = list[torch.Tensor]


@dataclass
class Sharpness:
    """L_t at w and at w + ρ·∇L/‖∇L‖ (``perturbed_loss``), and ‖∇L_t(w)‖."""

    rho: float
    loss: float
    perturbed_loss: float
    gradient_norm: float

    @property
    def value(self) -> float:
        """Sharp_t = perturbed_loss − loss."""
        return self.perturbed_loss - self.loss

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "sharpness": self.value}


@dataclass
class TopEigenvalue:
    """λ_max of the Hessian, the Hessian-vector products spent on it, and whether the iteration converged."""

    value: float
    iterations: int
    converged: bool

    def to_dict(self) -> dict[str, float | int | bool]:
        return asdict(self)


def sharpness(model: torch.nn.Module, params: Sequence[torch.nn.Parameter], batches: Sequence[Batch],
              rho: float) -> Sharpness:
    """Sharp_t at the model's current ``params`` (restored exactly afterwards)."""
    if not rho > 0:
        raise ValueError(f"rho must be positive, got {rho}")
    loss, gradient = loss_gradient(model, params, batches)
    norm = float(torch.sqrt(sum(g.pow(2).sum() for g in gradient)))
    with perturbed(params, ascent_step(gradient, rho)):
        ascended = evaluate_loss(model, batches).loss
    return Sharpness(rho=rho, loss=loss, perturbed_loss=ascended, gradient_norm=norm)


def hessian_vector_product(model: torch.nn.Module, params: Sequence[torch.nn.Parameter],
                           batches: Sequence[Batch], vector: Sequence[torch.Tensor]) -> Vector:
    """∇²L_t(w)·v, accumulated batch by batch."""
    n = num_examples(batches)
    product = [torch.zeros_like(p) for p in params]
    with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):
        for batch in batches:
            loss_sum, _ = batch_loss_sum(model, batch)
            grads = torch.autograd.grad(loss_sum / n, params, create_graph=True, allow_unused=True)
            used = [(g, v) for g, v in zip(grads, vector, strict=True) if g is not None]
            directional = sum((g * v).sum() for g, v in used)
            for acc, h in zip(product, torch.autograd.grad(directional, params, allow_unused=True), strict=True):
                if h is not None:
                    acc.add_(h)
    return product


def _dot(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    return float(sum((x * y).sum() for x, y in zip(a, b, strict=True)))


def _power_iteration(apply: Callable[[Vector], Vector], start: Vector, max_iterations: int,
                     tolerance: float) -> TopEigenvalue:
    """Dominant eigenvalue of the symmetric operator ``apply`` from ``start`` (Rayleigh quotients)."""
    norm = _dot(start, start) ** 0.5
    vector, estimate = [v / norm for v in start], None
    for iteration in range(1, max_iterations + 1):
        product = apply(vector)
        quotient = _dot(vector, product)
        norm = _dot(product, product) ** 0.5
        if norm == 0:
            return TopEigenvalue(0.0, iteration, True)
        vector = [p / norm for p in product]
        if estimate is not None and abs(quotient - estimate) <= tolerance * max(abs(quotient), 1e-12):
            return TopEigenvalue(quotient, iteration, True)
        estimate = quotient
    return TopEigenvalue(estimate, max_iterations, False)


def hessian_top_eigenvalue(model: torch.nn.Module, params: Sequence[torch.nn.Parameter], batches: Sequence[Batch],
                           *, max_iterations: int = 20, tolerance: float = 1e-3, seed: int = 0) -> TopEigenvalue:
    """λ_max(∇²L_t(w)) over ``params``; ``iterations`` counts every Hessian-vector product spent."""
    if max_iterations < 1:
        raise ValueError(f"max_iterations must be ≥ 1, got {max_iterations}")
    generator = torch.Generator().manual_seed(seed)

    def start() -> Vector:
        return [torch.randn(p.shape, generator=generator, dtype=p.dtype).to(p.device) for p in params]

    def hessian(v: Vector) -> Vector:
        return hessian_vector_product(model, params, batches, v)

    dominant = _power_iteration(hessian, start(), max_iterations, tolerance)
    if dominant.value >= 0:
        return dominant
    shift = dominant.value

    def shifted(v: Vector) -> Vector:
        return [h - shift * x for h, x in zip(hessian(v), v, strict=True)]

    top = _power_iteration(shifted, start(), max_iterations, tolerance)
    return TopEigenvalue(shift + top.value, dominant.iterations + top.iterations,
                         dominant.converged and top.converged)
