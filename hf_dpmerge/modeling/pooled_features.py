"""f(x), the input of a sequence classifier's head: what a fresh linear probe reads (``analysis/probe``). A
head-only training run caches the same input (:func:`~hf_dpmerge.modeling.prefix_split.boundary_inputs`).

An encoder's ``classifier`` takes one pooled vector per row. A decoder's ``score`` (``LlamaForSequenceClassification``
and kin) is applied at every position and the model keeps the row's last non-padding token, found by input id as
transformers finds it: i* = argmax_t t·[x_t ≠ pad] (one row at a time when the model has no pad token); f(x) is
the state there (:func:`last_token_index`)."""

from __future__ import annotations

from typing import Any

import datasets
import torch
from torch import nn

from hf_dpmerge.modeling.unwrapped import unwrapped_model

HEAD_NAMES = ("classifier", "score")  # an encoder's head; a decoder's (…ForSequenceClassification.score)


def classifier_head(model: nn.Module) -> nn.Module | None:
    """The task head of a (peft) sequence classifier (its ``modules_to_save`` wrapper), or None (a causal LM)."""
    base = unwrapped_model(model)
    return next((head for name in HEAD_NAMES if isinstance(head := getattr(base, name, None), nn.Module)), None)


def task_head(model: nn.Module) -> nn.Module:
    """:func:`classifier_head`, refused when there is none."""
    head = classifier_head(model)
    if head is None:
        base = unwrapped_model(model)
        raise ValueError(f"{type(base).__name__} has no 'classifier' or 'score' module: a head-only run or a probe "
                         "needs one")
    return head


def last_token_index(input_ids: torch.Tensor, pad_token_id: int | None) -> torch.Tensor:
    """Each row's last non-padding position, as a decoder classifier picks it; without a pad token only one row at
    a time (its last position), as transformers allows."""
    positions = torch.arange(input_ids.shape[-1], device=input_ids.device)
    if pad_token_id is None:
        if input_ids.shape[0] > 1:
            raise ValueError("a decoder classifier without a pad token (config.pad_token_id) cannot find the last "
                             "real token of padded rows: set the model's pad_token_id (the tokenizer's)")
        return positions[-1:]
    return (positions * (input_ids != pad_token_id)).argmax(-1)


def head_inputs(model: nn.Module, states: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """The head's input per row, [b, d]: ``states`` itself for an encoder, the last non-padding token's for a
    decoder's ``score`` (``states`` [b, T, d])."""
    if states.dim() == 2:
        return states
    index = last_token_index(input_ids, model.config.pad_token_id)
    return states[torch.arange(len(states), device=states.device), index]


@torch.no_grad()
def pooled_features(model: nn.Module, dataset: datasets.Dataset, collator: Any, batch_size: int) -> torch.Tensor:
    """f(x) for every row of a tokenised ``dataset``: the input of the model's head, in evaluation mode."""
    head, captured = task_head(model), []
    hook = head.register_forward_pre_hook(lambda _, args: captured.append(args[0].detach()))
    was_training = model.training
    model.eval()
    features = []
    try:
        inputs = dataset.remove_columns([c for c in dataset.column_names if c not in ("input_ids", "attention_mask",
                                                                                    "token_type_ids")])
        device = next(model.parameters()).device
        for start in range(0, len(inputs), batch_size):
            batch = {k: v.to(device) for k, v in
                     collator([inputs[i] for i in range(start, min(start + batch_size, len(inputs)))]).items()}
            model(**batch)
            features.append(head_inputs(model, captured.pop(), batch["input_ids"]))
    finally:
        hook.remove()
        model.train(was_training)
    width = head.in_features if hasattr(head, "in_features") else 0
    return torch.cat(features) if features else torch.zeros(0, width)
