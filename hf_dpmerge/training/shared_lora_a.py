"""Frozen shared LoRA A factors drawn from a public seed (FFA-LoRA, Sun et al., ICLR 2024 §3; docs/design.md §15.2).

Each LoRA layer's A ∈ ℝ^{r×d_in} is drawn, independently of any data, as peft's default initialisation does
(kaiming-uniform with a = √5, i.e. U(−1/√d_in, 1/√d_in)) from a ``torch.Generator`` seeded with

    seed_layer = first 8 bytes of sha256("<seed>:<module name>")   (module name as in the plain base model)

and frozen; only B (initialised to 0) and the task head are trained, clipped and noised. ΔW = s·B·A is then
linear in the trained B, and adapters trained from the same (base, targets, rank, seed) share every A, so a
merge of their deltas is the delta of the merged B's. Being data-independent, A is public: releasing it
costs no privacy, and it gets no per-sample gradient and no noise.
"""

from __future__ import annotations

import hashlib
import math

import torch
from torch import nn

from hf_dpmerge.records.fingerprint import base_fingerprint
from hf_dpmerge.utils.adapter_files import without_peft_prefix

DEFAULT_LORA_A_SEED = 20240507  # public: any fixed constant shared by every organisation works
SEED_ATTRIBUTE = "hf_dpmerge_lora_a_seed"  # set on a model whose A factors this module drew


def layer_seed(seed: int, module_name: str) -> int:
    """The generator seed of one layer's A: sha256 of ``"<seed>:<module name>"``, first 8 bytes."""
    digest = hashlib.sha256(f"{seed}:{without_peft_prefix(module_name)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def seeded_lora_a(seed: int, module_name: str, rank: int, fan_in: int) -> torch.Tensor:
    """A (rank × fan_in, float32) of the layer ``module_name``: U(−1/√fan_in, 1/√fan_in) from its seed."""
    generator = torch.Generator().manual_seed(layer_seed(seed, module_name))
    bound = 1 / math.sqrt(fan_in)
    return (torch.rand(rank, fan_in, generator=generator, dtype=torch.float64) * 2 - 1).mul(bound).float()


def lora_a_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every LoRA A weight of ``model``, named ``<module>.lora_A.<adapter>.weight`` as in the plain base."""
    from peft.tuners.lora import LoraLayer

    return {f"{without_peft_prefix(name)}.lora_A.{adapter}.weight": linear.weight
            for name, module in model.named_modules() if isinstance(module, LoraLayer)
            for adapter, linear in module.lora_A.items()}


def freeze_shared_lora_a(model: nn.Module, seed: int = DEFAULT_LORA_A_SEED) -> str:
    """Set every LoRA A of ``model`` to its seeded draw and freeze it; returns the A fingerprint
    (:func:`lora_a_fingerprint`). The seed is kept on the model for the privacy record."""
    from peft.tuners.lora import LoraLayer

    layers = [(name, module) for name, module in model.named_modules() if isinstance(module, LoraLayer)]
    if not layers or not any(module.lora_A for _, module in layers):
        raise ValueError("the model has no LoRA A factors to freeze: --lora_freeze_a needs LoRA layers")
    with torch.no_grad():
        for name, module in layers:
            for linear in module.lora_A.values():
                if not isinstance(linear, nn.Linear):
                    raise ValueError(f"{name}: --lora_freeze_a supports linear LoRA layers only; pass --lora_freeze_a "
                                     "false to train A")
                rank, fan_in = linear.weight.shape
                linear.weight.copy_(seeded_lora_a(seed, name, rank, fan_in))
                linear.weight.requires_grad_(False)
    setattr(model, SEED_ATTRIBUTE, seed)
    return lora_a_fingerprint(model)


def lora_a_fingerprint(model: nn.Module) -> str:
    """sha256 over the names, shapes and float32 bytes of the model's LoRA A tensors."""
    return base_fingerprint(lora_a_tensors(model))


def frozen_lora_a_record(model: nn.Module) -> dict | None:
    """``{"seed", "fingerprint"}`` when every LoRA A of ``model`` is frozen while some B trains (FFA-LoRA), for
    the privacy record's ``extra["lora_a"]``; None otherwise. ``seed`` is None for A's frozen by other means."""
    from peft.tuners.lora import LoraLayer

    a_trained = b_trained = False
    for module in model.modules():
        if isinstance(module, LoraLayer):
            a_trained |= any(p.requires_grad for p in module.lora_A.parameters())
            b_trained |= any(p.requires_grad for p in module.lora_B.parameters())
    if a_trained or not b_trained:
        return None
    return {"seed": getattr(model, SEED_ATTRIBUTE, None), "fingerprint": lora_a_fingerprint(model)}
