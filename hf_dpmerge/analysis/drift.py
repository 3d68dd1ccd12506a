"""Reference-point drift of a LoRA adapter from its base (DP-Merging §3.2 diagnostics; docs/design.md §1, §4).

Per adapted weight matrix W_0 with LoRA delta ΔW = s·B·A:   drift = ‖ΔW‖_F / ‖W_0‖_F;
in total:   drift = sqrt(Σ‖ΔW‖_F²) / sqrt(Σ‖W_0‖_F²) over the adapted matrices — the paper's ‖w_t − w_0‖/‖w_0‖
restricted to the weights the adapter changes. ‖ΔW‖_F comes from r×r Gram matrices
(:func:`hf_dpmerge.lora.lora_delta_sq_norm`), ΔW is never materialised. The task head is left
out: it is the task's own, never merged, and its W_0 is a random initialisation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from hf_dpmerge.lora import lora_delta_sq_norm, lora_factors
from hf_dpmerge.utils.adapter_files import without_peft_prefix


@dataclass
class LayerDrift:
    """‖ΔW‖_F and ‖W_0‖_F of one adapted matrix (``name`` as in the plain model)."""

    name: str
    delta_norm: float
    base_norm: float

    @property
    def ratio(self) -> float:
        return self.delta_norm / self.base_norm if self.base_norm > 0 else math.nan


@dataclass
class AdapterDrift:
    """Drift of every adapted matrix and in total."""

    layers: list[LayerDrift]

    @property
    def total(self) -> float:
        """sqrt(Σ‖ΔW‖²) / sqrt(Σ‖W_0‖²)."""
        base = math.sqrt(sum(layer.base_norm**2 for layer in self.layers))
        return math.sqrt(sum(layer.delta_norm**2 for layer in self.layers)) / base if base > 0 else math.nan

    def to_dict(self) -> dict:
        return {
            "total": self.total,
            "layers": {layer.name: {"delta_norm": layer.delta_norm, "base_norm": layer.base_norm,
                                    "ratio": layer.ratio} for layer in self.layers},
        }


@torch.no_grad()
def adapter_drift(model: torch.nn.Module) -> AdapterDrift:
    """Drift of every active LoRA layer of a peft ``model`` (one row per adapted matrix and adapter)."""
    from peft.tuners.lora import LoraLayer

    layers = []
    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        base_norm = float(torch.linalg.matrix_norm(module.get_base_layer().weight.float()))
        plain = without_peft_prefix(name)
        for factor in lora_factors(module):  # this layer's own (A, B, s), one per active adapter
            adapter = factor.name.rsplit(".", 1)[-1]
            label = plain if len(module.active_adapters) == 1 else f"{plain}.{adapter}"
            layers.append(LayerDrift(label, float(lora_delta_sq_norm(factor)) ** 0.5, base_norm))
    if not layers:
        raise ValueError("the model has no LoRA layers: drift is defined for LoRA adapters")
    return AdapterDrift(layers)
