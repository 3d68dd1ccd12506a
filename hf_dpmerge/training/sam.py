"""Sharpness-aware perturbations compatible with DP (docs/design.md §1–2).

- ``dp_sat`` (Park et al., ICML 2023): ascend w + ρ·g̃_{t−1}/‖g̃_{t−1}‖ along the previous step's
  *privatised* gradient (post-processing: no privacy cost), take the usual DP gradient there, restore w.
- ``two_query`` (DP-Merging Algorithm 1): e = ρ·g̃/‖g̃‖ from a first privatised query on the batch, then a
  second privatised query at w + e on the same batch (accounted as one step at σ/√2).
- ``per_example``: example i ascends along its own gradient, w_i = w + ρ·g_i/‖g_i‖, and its gradient at w_i is
  clipped once (one query, 2× compute), computed with torch.func since each example has its own weights.

The ascent step and its bit-exact restore are :mod:`hf_dpmerge.modeling.sam_ascent`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

SAM_MODES = ("none", "dp_sat", "per_example", "two_query")


def queries_per_step(sam_mode: str) -> int:
    """How many privatised queries of one Poisson batch a step of ``sam_mode`` makes (2 for ``two_query``, else 1);
    k queries at σ each are one step at σ_eff = σ/√k (:mod:`hf_dpmerge.training.dp.accounting`)."""
    return 2 if sam_mode == "two_query" else 1


def additive_4d_mask(mask: torch.Tensor, causal: bool, dtype: torch.dtype) -> torch.Tensor:
    """[b, T] 0/1 padding mask → ready [b, 1, T|1, T] additive mask (0 attend, dtype-min masked).

    transformers 5.x builds masks with data-dependent checks that vmap cannot trace; a prepared 4-D mask is
    passed through untouched (docs/design.md §3)."""
    allowed = mask[:, None, None, :].bool()
    if causal:
        length = mask.shape[-1]
        allowed = allowed & torch.ones(length, length, dtype=torch.bool, device=mask.device).tril()
    return (~allowed).to(dtype) * torch.finfo(dtype).min


ExampleLosses = Callable[[nn.Module, dict[str, torch.Tensor], torch.Tensor], torch.Tensor]


class _ExampleLosses(nn.Module):
    """``example_losses(model, features, labels)`` as a module's forward, so torch.func can call it with other
    weights (names of ``model``'s parameters prefixed with ``model.``)."""

    def __init__(self, model: nn.Module, example_losses: ExampleLosses):
        super().__init__()
        self.model = model
        self.example_losses = example_losses

    def forward(self, features: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        return self.example_losses(self.model, features, labels)


def per_example_sam_grads(
    model: nn.Module,
    names: Sequence[str],
    params: Sequence[nn.Parameter],
    inputs: dict[str, torch.Tensor],
    example_losses: ExampleLosses,
    rho: float,
) -> list[torch.Tensor]:
    """Per-example gradients at each example's own ascent point w + ρ·g_i/‖g_i‖ (shape [b, *p.shape]);
    ``example_losses(model, features, labels)`` gives the loss of each example of a batch."""
    labels = inputs["labels"]
    features = {k: v for k, v in inputs.items() if k != "labels" and isinstance(v, torch.Tensor)}
    losses = _ExampleLosses(model, example_losses)

    causal = labels.dim() == 2

    def loss_one(weights: dict[str, torch.Tensor], example: dict[str, torch.Tensor], label: torch.Tensor):
        batch = {k: v.unsqueeze(0) for k, v in example.items()}
        if "attention_mask" in batch:
            batch["attention_mask"] = additive_4d_mask(batch["attention_mask"], causal, params[0].dtype)
        prefixed = {f"model.{n}": w for n, w in weights.items()}
        return functional_call(losses, prefixed, args=(batch, label.unsqueeze(0)), strict=False)[0]

    grad_one = grad(loss_one)

    def perturbed_grad(weights, example, label):
        g = grad_one(weights, example, label)
        norm = torch.sqrt(sum(v.pow(2).sum() for v in g.values()))
        scale = rho / (norm + 1e-12)
        ascended = {k: weights[k] + scale * g[k] for k in weights}
        return grad_one(ascended, example, label)

    weights = {n: p.detach() for n, p in zip(names, params)}
    grads = vmap(perturbed_grad, in_dims=(None, 0, 0), randomness="different")(weights, features, labels)
    return [grads[n] for n in names]
