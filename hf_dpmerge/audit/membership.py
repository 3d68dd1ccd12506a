"""Membership scores of canaries from a released adapter, and the auditor's abstaining guesses.

    score_i = ℓ(base; x_i, y_i) − ℓ(base + adapter; x_i, y_i)

the loss reduction the adapter brings on canary i's own (random) label: large when training fitted that
example. Taking the difference to the base, rather than the adapter's loss alone, discounts canaries the base
happens to get right already. The score uses only the released weights, the base and the canaries
themselves, never the inclusion draw, as the one-run theorem requires.

Guesses (as in Steinke, Nasr & Jagielski 2023): "in" for the k₊ highest scores, "out" for the k₋ lowest,
abstain on the rest; k₊ and k₋ are fixed before the scores are seen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import datasets
import numpy as np
import torch

from hf_dpmerge.modeling.per_example_loss import per_example_loss


@torch.no_grad()
def _losses(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]]) -> np.ndarray:
    out = []
    for batch in batches:
        features = {k: v for k, v in batch.items() if k != "labels"}
        out.append(per_example_loss(model(**features).logits, batch["labels"]).float().cpu())
    return torch.cat(out).numpy().astype(np.float64)


def loss_reduction_scores(
    peft_model: Any,
    canaries: datasets.Dataset,
    collate: Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]],
    *,
    batch_size: int = 64,
) -> np.ndarray:
    """Per-canary loss reduction of ``peft_model`` over its base (the same model with the adapter disabled)."""
    device = next(peft_model.parameters()).device
    rows = [canaries[i] for i in range(len(canaries))]
    batches = [
        {k: v.to(device) for k, v in collate(rows[start : start + batch_size]).items()}
        for start in range(0, len(rows), batch_size)
    ]
    was_training = peft_model.training
    peft_model.eval()
    try:
        adapted = _losses(peft_model, batches)
        with peft_model.disable_adapter():
            base = _losses(peft_model, batches)
    finally:
        peft_model.train(was_training)
    return base - adapted


def one_run_guesses(scores: np.ndarray, k_plus: int, k_minus: int) -> np.ndarray:
    """+1 ("in") for the ``k_plus`` highest scores, −1 ("out") for the ``k_minus`` lowest, 0 elsewhere."""
    if k_plus < 0 or k_minus < 0 or k_plus + k_minus > len(scores):
        raise ValueError(f"need k₊, k₋ ≥ 0 and k₊ + k₋ ≤ {len(scores)} canaries, got k₊={k_plus}, k₋={k_minus}")
    order = np.argsort(scores, kind="stable")
    guesses = np.zeros(len(scores), dtype=int)
    guesses[order[len(scores) - k_plus :]] = 1
    guesses[order[:k_minus]] = -1
    return guesses
