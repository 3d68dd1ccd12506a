"""f(x), the input of a sequence classifier's head: what a fresh linear probe reads (``analysis/probe``). A
head-only training run caches the same input (:func:`~hf_dpmerge.modeling.prefix_split.boundary_inputs`)."""

from __future__ import annotations

from typing import Any

import datasets
import torch
from torch import nn


def task_head(model: nn.Module) -> nn.Module:
    """The classifier module of a peft sequence classifier (its ``modules_to_save`` wrapper)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = getattr(base, "classifier", None)
    if not isinstance(head, nn.Module):
        raise ValueError(f"{type(base).__name__} has no 'classifier' module: a head-only run or a probe needs one")
    return head


@torch.no_grad()
def pooled_features(model: nn.Module, dataset: datasets.Dataset, collator: Any, batch_size: int) -> torch.Tensor:
    """f(x) for every row of a tokenised ``dataset``: the input of the model's head, in evaluation mode."""
    head, captured = task_head(model), []
    hook = head.register_forward_pre_hook(lambda _, args: captured.append(args[0].detach()))
    was_training = model.training
    model.eval()
    try:
        inputs = dataset.remove_columns([c for c in dataset.column_names if c not in ("input_ids", "attention_mask",
                                                                                    "token_type_ids")])
        device = next(model.parameters()).device
        for start in range(0, len(inputs), batch_size):
            batch = collator([inputs[i] for i in range(start, min(start + batch_size, len(inputs)))])
            model(**{k: v.to(device) for k, v in batch.items()})
    finally:
        hook.remove()
        model.train(was_training)
    width = head.in_features if hasattr(head, "in_features") else 0
    return torch.cat(captured) if captured else torch.zeros(0, width)
