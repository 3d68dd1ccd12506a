"""The public anchor of a causal-LM adapter: its answers to public prompts stay the base model's (docs/design.md §14.1).

    A(θ) = μ · (1/|P|) Σ_{p∈P} (1/|r_p|) Σ_{t∈r_p} KL( p_base(· | p, r_<t) ‖ p_θ(· | p, r_<t) )

P: public prompts of other formats (:mod:`hf_dpmerge.data.public_prompts`), each rendered as the model is asked
(the chat template); r_p: the base's own greedy answer to p, its end-of-sequence token included when the base ends
within ``max_new_tokens``. A depends on public data and the weights only, so its gradient is added to the
privatised gradient after the noise (post-processing, no privacy cost), like the alignment penalty's. Both models
are read in evaluation mode (no dropout): at θ = base (LoRA B = 0) A = 0 and ∇A = 0, so the anchor acts only as
the adapter drifts, and then pulls its behaviour outside its own task back to the base's. A merge sums the
adapters' deltas, and each delta also acts on the other tasks' prompts: an adapter that learnt to end its own
answers early pushes that end at every answer's first position too (docs/causal-lm.md, "Ending the answer").
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import datasets
import torch
import torch.nn.functional as F
from peft import PeftModel
from torch import nn
from transformers import PreTrainedTokenizerBase

from hf_dpmerge.data.instructions import IGNORE_INDEX, render_prompt


@torch.no_grad()
def anchor_rows(model: nn.Module, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str],
                max_new_tokens: int) -> datasets.Dataset:
    """The anchor's rows: each prompt rendered, then the base's greedy answer (``model``: the base, or a peft model
    whose adapter is disabled while it answers), up to and including its end-of-sequence token, at most
    ``max_new_tokens`` tokens: ``input_ids``, ``attention_mask`` and ``labels`` (-100 on the prompt, so the
    divergence is read at the answer's positions)."""
    if max_new_tokens < 1:
        raise ValueError(f"--anchor_max_new_tokens must be ≥ 1, got {max_new_tokens}")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    rows: dict[str, list[list[int]]] = {"input_ids": [], "attention_mask": [], "labels": []}
    was_training = model.training
    model.eval()
    try:
        with model.disable_adapter() if isinstance(model, PeftModel) else contextlib.nullcontext():
            for prompt in prompts:
                ids = tokenizer(render_prompt(tokenizer, prompt), add_special_tokens=False)["input_ids"]
                generated = model.generate(input_ids=torch.tensor([ids], device=device),
                                           attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=device),
                                           max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad)
                answer = generated[0, len(ids):].tolist()
                if tokenizer.eos_token_id in answer:  # up to and including the end
                    answer = answer[: answer.index(tokenizer.eos_token_id) + 1]
                rows["input_ids"].append(ids + answer)
                rows["attention_mask"].append([1] * (len(ids) + len(answer)))
                rows["labels"].append([IGNORE_INDEX] * len(ids) + answer)
    finally:
        model.train(was_training)
    return datasets.Dataset.from_dict(rows)


def anchor_divergence(logits: torch.Tensor, base_logits: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    """Each row's mean over its answer positions (``answer`` [b, w], bool) of KL(p_base ‖ p_θ) between the
    next-token distributions of ``base_logits`` and ``logits`` ([b, w, V]); shape [b]."""
    log_p = F.log_softmax(logits.float(), dim=-1)
    log_base = F.log_softmax(base_logits.float(), dim=-1)
    token_kl = (log_base.exp() * (log_base - log_p)).sum(dim=-1)
    return (token_kl * answer).sum(dim=1) / answer.sum(dim=1).clamp(min=1)
