"""Per-example losses, so that the summed loss's per-sample gradients are each example's own gradient.

- sequence classification (labels of shape [b]): cross-entropy, or MSE when the model has one output;
- causal LM (labels of shape [b, T]): next-token cross-entropy averaged over each example's own
  non-ignored (≠ -100) tokens, so an example's weight does not depend on the other examples in the batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def per_example_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Loss of each example, shape [b]."""
    if labels.dim() == 1:
        if logits.shape[-1] == 1:
            return F.mse_loss(logits.squeeze(-1), labels.to(logits.dtype), reduction="none")
        return F.cross_entropy(logits, labels, reduction="none")
    if labels.dim() == 2 and logits.dim() == 3:
        shift_logits = logits[:, :-1, :]
        shift_labels = labels[:, 1:]
        token_loss = F.cross_entropy(
            shift_logits.reshape(-1, shift_logits.shape[-1]),
            shift_labels.reshape(-1),
            ignore_index=-100,
            reduction="none",
        ).view(shift_labels.shape)
        counts = (shift_labels != -100).sum(dim=1).clamp(min=1)
        return token_loss.sum(dim=1) / counts
    raise ValueError(
        f"cannot derive per-example losses from logits {tuple(logits.shape)} and labels {tuple(labels.shape)}"
    )
