"""Tiny merge inputs for the merging tests: a saved base, LoRA task adapters and full-model variants,
each with a privacy record, laid out like the training example's ``runs/`` directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, get_peft_model

from hf_dpmerge.records.fingerprint import base_fingerprint, peft_base_tensors
from hf_dpmerge.records.record import CAUSAL_LM, PrivacyRecord
from hf_dpmerge.training.encoder_adapter import export_encoder_adapter
from hf_dpmerge.training.shared_lora_a import freeze_shared_lora_a, frozen_lora_a_record
from tests.utils.records import privacy_record
from tests.utils.tiny_models import save_tiny_bert, tiny_bert, tiny_llama

HASHED = ["bert.encoder.layer.0.attention.self.query.weight", "bert.encoder.layer.1.attention.self.value.weight"]


def adamw_record(task: str | None = None, **overrides: Any) -> PrivacyRecord:
    """The merging tests' record: ε = 8 and AdamW noise settings unless overridden."""
    settings: dict[str, Any] = dict(epsilon=8.0, optimizer={"name": "AdamW", "lr": 1e-3}, sum_lr_squared=1e-4)
    return privacy_record(task, **(settings | overrides))


def save_base(directory: Path) -> Path:
    return save_tiny_bert(directory, num_labels=2, seed=0)


def save_task_adapter(runs: Path, task: str, num_labels: int, seed: int, **record: Any) -> Path:
    """``runs/<task>/adapter`` (LoRA on query/value + head) and ``runs/<task>/encoder_adapter``."""
    model = tiny_bert(num_labels=num_labels, seed=0)
    torch.manual_seed(seed)
    config = LoraConfig(
        target_modules=["query", "value"], r=4, lora_alpha=8, modules_to_save=["classifier"],
        task_type="SEQ_CLS", init_lora_weights=False,
    )
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_" in name:
                parameter.mul_(0.3)
    tensors = peft_base_tensors(peft_model)
    adapter = runs / task / "adapter"
    peft_model.save_pretrained(adapter)
    adamw_record(task=task, base_model_hash=base_fingerprint(tensors), base_model_hash_tensors=sorted(tensors),
                **record).save(adapter)
    export_encoder_adapter(adapter, runs / task / "encoder_adapter")
    return runs / task / "encoder_adapter"


SHARED_A_SEED = 11
NOISE_STD_B = 0.01  # adamw_record: V_B = sum_lr_squared = 1e-4


def save_shared_a_adapter(runs: Path, task: str, labels: int, seed: int, a_seed: int | None = SHARED_A_SEED,
                          causal: bool = False) -> Path:
    """``runs/<task>/encoder_adapter`` (a tiny BERT's; ``causal``: ``runs/<task>/adapter``, a tiny Llama's LoRA on
    q/v) with A frozen from ``a_seed`` (None: A trained, no lora_a in the record) and a sparse B signal plus noise
    at the record's V_B."""
    from tests.utils.training_helpers import lora_classifier

    if causal:
        model = get_peft_model(tiny_llama(seed=0), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                              task_type="CAUSAL_LM"))
    else:
        model = lora_classifier(seed=0, num_labels=labels)
    if a_seed is not None:
        freeze_shared_lora_a(model, a_seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".lora_B." in name:
                signal = 0.05 * torch.randn(parameter.shape, generator=generator)
                signal *= torch.rand(parameter.shape, generator=generator) < 0.3
                parameter.copy_(signal + NOISE_STD_B * torch.randn(parameter.shape, generator=generator))
            elif ".lora_A." in name and a_seed is None:
                parameter.normal_(0, 0.1, generator=generator)
    tensors = peft_base_tensors(model)
    lora_a = frozen_lora_a_record(model)
    adapter = runs / task / "adapter"
    model.save_pretrained(adapter)
    extra = {**({"lora_a": lora_a} if lora_a else {}), **({"model_kind": CAUSAL_LM} if causal else {})}
    adamw_record(task=task, base_model_hash=base_fingerprint(tensors), base_model_hash_tensors=sorted(tensors),
                 extra=extra).save(adapter)
    return adapter if causal else export_encoder_adapter(adapter, runs / task / "encoder_adapter")


def save_shared_a_runs(runs: Path, tasks: dict[str, int]) -> Path:
    """``runs/base`` and, for the i-th task (from 1), its shared-A encoder adapter with that many labels, seeded i."""
    save_base(runs / "base")
    for seed, (task, labels) in enumerate(tasks.items(), start=1):
        save_shared_a_adapter(runs, task, labels, seed)
    return runs


def save_merge_runs(runs: Path, tasks: dict[str, int]) -> Path:
    """``runs/base`` and, for the i-th task (from 1), its adapters with that many labels, seeded i."""
    save_base(runs / "base")
    for seed, (task, num_labels) in enumerate(tasks.items(), start=1):
        save_task_adapter(runs, task, num_labels, seed)
    return runs


def save_variant(base_dir: Path, directory: Path, seed: int, scale: float = 0.02, **record: Any) -> Path:
    """A full fine-tune stand-in: the base plus a random perturbation of every weight."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(base_dir)
    reference = {name: model.state_dict()[name].clone() for name in HASHED}
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(scale * torch.randn(parameter.shape, generator=generator))
    model.save_pretrained(directory)
    adamw_record(base_model_hash=base_fingerprint(reference), base_model_hash_tensors=HASHED, **record).save(directory)
    return directory


SCALE = "parameters:\n  lambda: 1.0\n"  # our methods' required scale


def lora_config_yaml(method: str, base: str, adapters: list[str], parameters: str = SCALE,
                     per_model: str = "") -> str:
    models = "".join(f"  - model: {base}+{adapter}\n{per_model}" for adapter in adapters)
    return f"merge_method: {method}\nbase_model: {base}\nmodels:\n{models}dtype: float32\n{parameters}"


def full_config_yaml(method: str, base: str, variants: list[str], parameters: str = SCALE,
                     per_model: str = "") -> str:
    models = "".join(f"  - model: {variant}\n{per_model}" for variant in variants)
    return f"merge_method: {method}\nbase_model: {base}\nmodels:\n{models}dtype: float32\n{parameters}"
