"""LoRA factors of a peft model and the norm of their delta, shared by training, analysis and merging.

    ΔW = s·B·A  (s = α/r, or α/√r with rsLoRA),   ‖s·B·A‖_F² = s² · Σ_ij (BᵀB)_ij (A Aᵀ)_ij

The norm uses r×r Gram matrices only and never materialises the d_out×d_in delta (docs/design.md §4).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn


class UnsupportedAdapterError(ValueError):
    """The adapter's delta is not s·B·A, so the Gram-form penalty would be wrong."""


@dataclass
class LoraFactor:
    name: str
    lora_a: torch.Tensor  # r × d_in
    lora_b: torch.Tensor  # d_out × r
    scaling: float


def lora_factors(model: nn.Module) -> Iterator[LoraFactor]:
    """Every active LoRA (A, B, s) triple; refuses DoRA, LoRA biases and convolutional LoRA."""
    from peft.tuners.lora import LoraLayer

    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        for adapter in module.active_adapters:
            if module.use_dora.get(adapter, False):
                raise UnsupportedAdapterError(
                    f"{name}: DoRA adapters (use_dora=True) have delta m·(W+sBA)/‖W+sBA‖ − W, not s·B·A; "
                    "the alignment penalty and the merge methods support plain LoRA only"
                )
            if getattr(module, "lora_bias", {}).get(adapter, False):
                raise UnsupportedAdapterError(f"{name}: LoRA with lora_bias=True is not supported")
            if adapter in module.lora_A:
                lora_a, lora_b = module.lora_A[adapter].weight, module.lora_B[adapter].weight
            elif adapter in getattr(module, "lora_embedding_A", {}):
                # embedding LoRA stores A as r × num_embeddings and B as dim × r; ‖(BA)ᵀ‖ = ‖BA‖
                lora_a, lora_b = module.lora_embedding_A[adapter], module.lora_embedding_B[adapter]
            else:
                continue
            if lora_a.dim() != 2 or lora_b.dim() != 2:
                raise UnsupportedAdapterError(f"{name}: convolutional LoRA is not supported")
            yield LoraFactor(f"{name}.{adapter}", lora_a, lora_b, float(module.scaling[adapter]))


def lora_delta_sq_norm(factor: LoraFactor) -> torch.Tensor:
    """‖s·B·A‖_F² from the r×r Grams BᵀB and AAᵀ."""
    gram_b = factor.lora_b.transpose(0, 1) @ factor.lora_b
    gram_a = factor.lora_a @ factor.lora_a.transpose(0, 1)
    return factor.scaling**2 * (gram_b * gram_a).sum()
