"""A causal LM as a classifier: the label whose verbaliser (response) is most likely after the prompt.

    score(x, k) = log p(r_k | prompt(x)) = Σ_j log p(r_{k,j} | prompt(x), r_{k,<j})
    prediction(x) = argmax_k score(x, k)

(rank classification; docs/design.md §14). Each prompt runs once: a batch of prompts of similar length, left-padded
(positions counted from each prompt's first real token, pad positions masked), keeps its key/value cache; the
last prompt position gives every response's first token, and each label's remaining tokens run on that cache
(cropped back to the prompt after each label). With K labels this costs one prompt pass, not K. Padding never
changes a score (masked pad positions, positions of real tokens as in an unpadded pass).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import numpy as np
import torch

from hf_dpmerge.modeling.unwrapped import unwrapped_model


def _cache_keyword(model: torch.nn.Module) -> str:
    """The forward keyword taking a key/value cache: ``cache`` (transformers ≥ 5.25), else ``past_key_values``."""
    base = unwrapped_model(model)
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"



@torch.inference_mode()
def verbaliser_scores(model: torch.nn.Module, prompts: Sequence[Sequence[int]],
                      responses: Sequence[Sequence[int]], *, pad_token_id: int = 0,
                      batch_size: int = 16) -> np.ndarray:
    """[n_examples, n_labels] log-likelihoods of each label's response after each prompt."""
    if any(len(response) == 0 for response in responses):
        raise ValueError("every label needs a non-empty response to be scored")
    device, cache_keyword = next(model.parameters()).device, _cache_keyword(model)
    order = np.argsort([len(prompt) for prompt in prompts], kind="stable")
    scores = np.zeros((len(prompts), len(responses)), dtype=np.float64)
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        width = max(len(prompts[i]) for i in rows)
        ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for row, i in enumerate(rows):
            ids[row, width - len(prompts[i]):] = torch.as_tensor(prompts[i])
            mask[row, width - len(prompts[i]):] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        first = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
        cache, next_position = getattr(out, cache_keyword), positions[:, -1:] + 1
        for k, response in enumerate(responses):
            response = torch.as_tensor(response, device=device)
            total = first[:, response[0]]
            if len(response) > 1:
                rest = response[:-1].expand(len(rows), -1)
                steps = torch.arange(len(rest[0]), device=device)
                logits = model(input_ids=rest, attention_mask=torch.cat([mask, torch.ones_like(rest)], dim=1),
                               position_ids=next_position + steps, use_cache=True, **{cache_keyword: cache}).logits
                log_probs = torch.log_softmax(logits.float(), dim=-1)
                total = total + log_probs.gather(2, response[1:].expand(len(rows), -1)[..., None]).sum(dim=(1, 2))
                cache.crop(1 - len(response))  # back to the prompt (a negative crop removes tokens)
            scores[rows, k] = total.cpu().numpy()
    return scores


def verbaliser_predictions(model: torch.nn.Module, prompts: Sequence[Sequence[int]],
                           responses: Sequence[Sequence[int]], *, pad_token_id: int = 0,
                           batch_size: int = 16) -> np.ndarray:
    """The argmax label of :func:`verbaliser_scores` for each prompt."""
    scores = verbaliser_scores(model, prompts, responses, pad_token_id=pad_token_id, batch_size=batch_size)
    return scores.argmax(axis=1)
