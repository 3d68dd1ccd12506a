"""LoRA factors — of a peft model's layers or of a saved adapter — and the norm of their delta, shared by training,
analysis and merging.

    ΔW = s·B·A  (s = α/r, or α/√r with rsLoRA),   ‖s·B·A‖_F² = s² · Σ_ij (BᵀB)_ij (A Aᵀ)_ij

The norm uses r×r Gram matrices only and never materialises the d_out×d_in delta (docs/design.md §4).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hf_dpmerge.utils.adapter_files import read_adapter_weights, without_peft_prefix


class UnsupportedAdapterError(ValueError):
    """The adapter's delta is not s·B·A, so the Gram-form penalty would be wrong."""


@dataclass(frozen=True)
class LoraFactor:
    """One LoRA layer: ΔW = scaling·B·A, transposed into the weight's layout when ``fan_in_fan_out``; a saved
    adapter's factors also name their keys in ``adapter_model.safetensors`` (``saved_a``, ``saved_b``)."""

    name: str
    lora_a: torch.Tensor  # r × d_in
    lora_b: torch.Tensor  # d_out × r
    scaling: float
    fan_in_fan_out: bool = False
    saved_a: str = ""
    saved_b: str = ""

    def delta_factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(L, R) with ΔW = L·R in the weight's layout: (s·B, A), or (Aᵀ, s·Bᵀ) when ``fan_in_fan_out``."""
        if self.fan_in_fan_out:
            return self.lora_a.T, self.scaling * self.lora_b.T
        return self.scaling * self.lora_b, self.lora_a


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


def penalty_curvature(factor: LoraFactor, penalty: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(h_A, h_B): the diagonal of the Hessian of λ·‖s·B·A‖_F² in each factor, shaped to broadcast against A (r×d_in)
    and B (d_out×r): ∂²/∂B_ir² = 2λs²·(A Aᵀ)_rr, ∂²/∂A_rj² = 2λs²·(BᵀB)_rr (docs/design.md §4 and §6)."""
    a, b = factor.lora_a.detach().double(), factor.lora_b.detach().double()
    scale = 2 * penalty * factor.scaling**2
    return scale * b.square().sum(dim=0).unsqueeze(1), scale * a.square().sum(dim=1).unsqueeze(0)


@dataclass(frozen=True)
class SavedAdapter:
    """What a saved peft adapter changes, by base weight name: LoRA layers (``factors``), and fully trained weights
    (``trained``: ``modules_to_save`` heads, other PEFT parameters, each mapped to its saved key). Everything else
    stayed frozen."""

    config: Any  # the adapter's peft config (a LoraConfig for LoRA adapters)
    factors: dict[str, LoraFactor]
    trained: dict[str, str]
    tensors: dict[str, torch.Tensor]


def load_saved_adapter(adapter_dir: str | os.PathLike) -> SavedAdapter:
    """The adapter saved in ``adapter_dir``, read through peft (``PeftConfig.from_pretrained``,
    ``load_peft_weights``); each LoRA layer's scaling is peft's: α/r, or α/√r with rsLoRA, α from ``alpha_pattern``
    when it names the layer and r from the factor's shape. Refuses any adapter but plain LoRA (DoRA included)."""
    from peft import PeftConfig
    from peft.utils.other import get_pattern_key

    directory = Path(adapter_dir)
    config = PeftConfig.from_pretrained(str(directory))
    if config.peft_type != "LORA" or getattr(config, "use_dora", False):
        dora = getattr(config, "use_dora", False)
        kind = "a DoRA adapter (use_dora: true)" if dora else f"a {config.peft_type} adapter"
        raise UnsupportedAdapterError(f"{directory} is {kind}")
    tensors = read_adapter_weights(directory)
    patterns = config.alpha_pattern or {}
    factors, trained = {}, {}
    for key, value in tensors.items():
        module = without_peft_prefix(key).rsplit(".", 1)[0]
        if ".lora_A." in key:
            module = module.removesuffix(".lora_A")
            alpha = float(patterns.get(get_pattern_key(patterns, module), config.lora_alpha))
            rank = value.shape[0]
            scaling = alpha / rank**0.5 if config.use_rslora else alpha / rank
            key_b = key.replace(".lora_A.", ".lora_B.")
            factors[f"{module}.weight"] = LoraFactor(f"{module}.weight", value, tensors[key_b], scaling,
                                                      bool(config.fan_in_fan_out), key, key_b)
        elif ".lora_B." not in key:  # a trained weight keeps its own leaf name (classifier.bias ≠ classifier.weight)
            name = without_peft_prefix(key).replace(".modules_to_save.default", "")
            if ".lora_" in name:  # another PEFT parameter of a LoRA layer changes that layer's weight
                name = f"{name.split('.lora_')[0]}.weight"
            trained[name] = key
    return SavedAdapter(config, factors, trained, tensors)
