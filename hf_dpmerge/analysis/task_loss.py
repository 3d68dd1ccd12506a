"""The task loss L_t(w) = (1/N)·Σ_i ℓ(w; x_i, y_i) over an evaluation set, and its gradient.

ℓ is training's per-example loss (:func:`hf_dpmerge.modeling.per_example_loss.per_example_loss`: cross-entropy
for classification, squared error for regression). Batches come from
:func:`hf_dpmerge.analysis.batching.length_sorted_batches`; per-batch padding does not change the loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from hf_dpmerge.analysis.batching import Batch
from hf_dpmerge.modeling.per_example_loss import per_example_loss


@dataclass
class LossEvaluation:
    """Mean loss over the set and the logits of every row, in dataset order."""

    loss: float
    logits: np.ndarray


def num_examples(batches: Sequence[Batch]) -> int:
    total = sum(len(batch.indices) for batch in batches)
    if total == 0:
        raise ValueError("the evaluation set is empty")
    return total


def batch_loss_sum(model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ_{i in batch} ℓ_i, logits) at the model's current weights, on the model's device."""
    device = next(model.parameters()).device
    inputs, labels = batch.to(device)
    if labels is None:
        raise ValueError("the evaluation set has no labels; the loss needs them")
    logits = model(**inputs).logits
    return per_example_loss(logits, labels).sum(), logits


@torch.no_grad()
def evaluate_loss(model: torch.nn.Module, batches: Sequence[Batch]) -> LossEvaluation:
    """L_t(w) and the logits, without gradients."""
    n = num_examples(batches)
    total, rows = 0.0, np.empty(n, dtype=object)
    for batch in batches:
        loss_sum, logits = batch_loss_sum(model, batch)
        total += float(loss_sum)
        for i, row in zip(batch.indices, logits.float().cpu().numpy(), strict=True):
            rows[i] = row
    return LossEvaluation(total / n, np.stack(rows))


def loss_gradient(model: torch.nn.Module, params: Sequence[torch.nn.Parameter],
                  batches: Sequence[Batch]) -> tuple[float, list[torch.Tensor]]:
    """(L_t(w), ∇_params L_t(w)), accumulated batch by batch."""
    n = num_examples(batches)
    total, grads = 0.0, [torch.zeros_like(p) for p in params]
    with torch.enable_grad():
        for batch in batches:
            loss_sum, _ = batch_loss_sum(model, batch)
            batch_grads = torch.autograd.grad(loss_sum / n, params, allow_unused=True)
            total += float(loss_sum.detach())
            for acc, g in zip(grads, batch_grads, strict=True):
                if g is not None:
                    acc.add_(g)
    return total / n, grads
