"""A peft LoRA causal language model: the base LM with LoRA on its attention projections, nothing else trained.

Unlike the sequence classifier (:mod:`.lora_classifier`) there is no task head: the task is in the data
(:mod:`hf_dpmerge.data.instructions`), so the adapter is LoRA alone and mergekit applies it with
``base+adapter`` as it is.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from hf_dpmerge.training.lora_classifier import check_target_modules, lora_layer_indices
from hf_dpmerge.training.shared_lora_a import DEFAULT_LORA_A_SEED, freeze_shared_lora_a
from hf_dpmerge.utils.quiet import expected_warnings_ignored


def lora_causal_lm(base: str | os.PathLike, *, r: int, alpha: int, target_modules: Sequence[str],
                   layers: str = "all", freeze_a: bool = False, a_seed: int = DEFAULT_LORA_A_SEED) -> PeftModel:
    """``base`` (a float32 checkpoint: :func:`hf_dpmerge.modeling.causal_base.save_causal_base`) with LoRA(r, α)
    on ``target_modules`` of ``layers`` ('all', 'top_half' or indices). ``freeze_a`` draws every A from the public
    ``a_seed`` and freezes it, so only B trains (FFA-LoRA; :mod:`hf_dpmerge.training.shared_lora_a`)."""
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    check_target_modules(model, target_modules)
    with expected_warnings_ignored():
        model = get_peft_model(model, LoraConfig(
            r=r, lora_alpha=alpha, target_modules=list(target_modules), task_type="CAUSAL_LM",
            layers_to_transform=lora_layer_indices(layers, model.config.num_hidden_layers),
        ))
    if freeze_a:
        freeze_shared_lora_a(model, a_seed)
    return model
