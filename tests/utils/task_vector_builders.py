"""Tiny LoRA adapters with chosen factors (hence known task vectors), saved in the training runs layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, get_peft_model

from hf_dpmerge.training.encoder_adapter import export_encoder_adapter
from tests.utils.merging_builders import adamw_record
from tests.utils.tiny_models import save_tiny_bert, tiny_bert

RANK = 2
ALPHA = 4  # scaling s = α / r = 2
HIDDEN = 32  # tiny_bert's hidden size: every query/value ΔW is 32×32
Factors = dict[str, tuple[torch.Tensor, torch.Tensor]]  # LoRA module name (e.g. "0.attention.self.query") -> (A, B)


def save_runs_base(runs: Path) -> Path:
    return save_tiny_bert(runs / "base", num_labels=2, seed=0)


def lora_modules() -> list[str]:
    return [f"{layer}.attention.self.{kind}" for layer in range(2) for kind in ("query", "value")]


def random_factors(seed: int) -> Factors:
    generator = torch.Generator().manual_seed(seed)
    return {m: (torch.randn(RANK, HIDDEN, generator=generator), torch.randn(HIDDEN, RANK, generator=generator))
            for m in lora_modules()}


def orthogonal_pair(seed: int) -> tuple[Factors, Factors]:
    """Two factor sets whose A rows span orthogonal subspaces, so ⟨B₁A₁, B₂A₂⟩_F = 0 in every layer."""
    generator = torch.Generator().manual_seed(seed)
    first, second = {}, {}
    for module in lora_modules():
        basis, _ = torch.linalg.qr(torch.randn(HIDDEN, HIDDEN, generator=generator, dtype=torch.float64))
        first[module] = (basis[:, :RANK].T.float(), torch.randn(HIDDEN, RANK, generator=generator))
        second[module] = (basis[:, RANK:2 * RANK].T.float(), torch.randn(HIDDEN, RANK, generator=generator))
    return first, second


def save_adapter(runs: Path, task: str, factors: Factors, **record: Any) -> Path:
    """``runs/<task>/adapter`` (LoRA + head, record) and ``runs/<task>/encoder_adapter``; returns the run folder."""
    config = LoraConfig(target_modules=["query", "value"], r=RANK, lora_alpha=ALPHA, modules_to_save=["classifier"],
                        task_type="SEQ_CLS")
    model = get_peft_model(tiny_bert(num_labels=2, seed=0), config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            for module, (lora_a, lora_b) in factors.items():
                if f"layer.{module}.lora_A." in name:
                    parameter.copy_(lora_a)
                elif f"layer.{module}.lora_B." in name:
                    parameter.copy_(lora_b)
    model.save_pretrained(runs / task / "adapter")
    adamw_record(task=task, **record).save(runs / task / "adapter")
    export_encoder_adapter(runs / task / "adapter", runs / task / "encoder_adapter")
    return runs / task


def delta(factors: Factors, module: str) -> torch.Tensor:
    """The dense ΔW = s·B·A of ``module`` (32×32)."""
    lora_a, lora_b = factors[module]
    return (ALPHA / RANK) * lora_b.double() @ lora_a.double()
