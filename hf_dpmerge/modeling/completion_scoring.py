"""A causal LM on prompt → completion rows: the share of completion tokens it predicts, teacher-forced.

    token_accuracy = Σ_x Σ_j [argmax_v p(v | prompt(x), r_{x,<j}) = r_{x,j}] / Σ_x |r_x|

over every row x and completion token j (greedy next-token prediction given the true prefix). Rows run right-padded
(real tokens keep positions 0…n−1, pad positions masked), so padding never changes a prediction.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


@torch.inference_mode()
def completion_token_accuracy(model: torch.nn.Module, rows: Sequence[tuple[Sequence[int], Sequence[int]]], *,
                              pad_token_id: int = 0, batch_size: int = 16) -> float:
    """``token_accuracy`` (module docstring) of ``model`` on (prompt ids, response ids) rows."""
    if not rows or any(len(response) == 0 for _, response in rows):
        raise ValueError("scoring needs at least one row, each with a non-empty completion")
    device = next(model.parameters()).device
    correct = total = 0
    for start in range(0, len(rows), batch_size):
        batch = rows[start:start + batch_size]
        width = max(len(prompt) + len(response) for prompt, response in batch)
        ids = torch.full((len(batch), width), pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (prompt, response) in enumerate(batch):
            ids[row, :len(prompt) + len(response)] = torch.as_tensor([*prompt, *response])
            mask[row, :len(prompt) + len(response)] = 1
        predicted = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.argmax(dim=-1).cpu()
        for row, (prompt, response) in enumerate(batch):
            guesses = predicted[row, len(prompt) - 1:len(prompt) + len(response) - 1]
            correct += int((guesses == torch.as_tensor(response)).sum())
            total += len(response)
    return correct / total
