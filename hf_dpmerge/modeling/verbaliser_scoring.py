"""A causal LM as a classifier: the label whose verbaliser (response) is most likely after the prompt.

    score(x, k) = log p(r_k | prompt(x)) = Σ_j log p(r_{k,j} | prompt(x), r_{k,<j})
    prediction(x) = argmax_k score(x, k)

(rank classification; docs/design.md §14). Every (example, label) sequence is scored once, right-padded in
batches of similar length; padding never changes a score (causal attention, masked pad positions).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from hf_dpmerge.modeling.per_example_loss import per_example_loss

IGNORE_INDEX = -100


@torch.inference_mode()
def verbaliser_scores(model: torch.nn.Module, prompts: Sequence[Sequence[int]],
                      responses: Sequence[Sequence[int]], *, pad_token_id: int = 0,
                      batch_size: int = 16) -> np.ndarray:
    """[n_examples, n_labels] log-likelihoods of each label's response after each prompt."""
    device = next(model.parameters()).device
    pairs = [(i, k) for i in range(len(prompts)) for k in range(len(responses))]
    lengths = [len(prompts[i]) + len(responses[k]) for i, k in pairs]
    order = np.argsort(lengths, kind="stable")
    scores = np.zeros((len(prompts), len(responses)), dtype=np.float64)
    for start in range(0, len(order), batch_size):
        chosen = [pairs[j] for j in order[start:start + batch_size]]
        width = max(lengths[j] for j in order[start:start + batch_size])
        ids = torch.full((len(chosen), width), pad_token_id, dtype=torch.long)
        labels = torch.full((len(chosen), width), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(chosen), width), dtype=torch.long)
        for row, (i, k) in enumerate(chosen):
            sequence = [*prompts[i], *responses[k]]
            ids[row, :len(sequence)] = torch.tensor(sequence)
            labels[row, len(prompts[i]):len(sequence)] = torch.tensor(responses[k])
            mask[row, :len(sequence)] = 1
        ids, labels, mask = ids.to(device), labels.to(device), mask.to(device)
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
        counts = (labels[:, 1:] != IGNORE_INDEX).sum(dim=1)
        total = (-per_example_loss(logits, labels) * counts).cpu().numpy()  # mean → sum over response tokens
        for row, (i, k) in enumerate(chosen):
            scores[i, k] = total[row]
    return scores


def verbaliser_predictions(model: torch.nn.Module, prompts: Sequence[Sequence[int]],
                           responses: Sequence[Sequence[int]], *, pad_token_id: int = 0,
                           batch_size: int = 16) -> np.ndarray:
    """The argmax label of :func:`verbaliser_scores` for each prompt."""
    scores = verbaliser_scores(model, prompts, responses, pad_token_id=pad_token_id, batch_size=batch_size)
    return scores.argmax(axis=1)
