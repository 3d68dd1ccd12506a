"""Where an ``emr`` root (``merge_method: emr``, :mod:`hf_dpmerge.merging.methods.emr`) meets its tasks: the root's
unified delta δ_uni = W_root − W_0 over the weights the merge changed, and each task run's modulator (masks and
rescaler, :mod:`hf_dpmerge.modeling.task_modulator`) from its adapter's exact LoRA delta τ_t = s·B·A. ``hf-dpmerge
evaluate`` scores each task on its modulated model, and the release stores δ_uni at its root and each modulator
beside its task's head, where stock loaders apply them (the remote code's ``modulated``).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from hf_dpmerge.analysis.task_models import load_merged_with_head
from hf_dpmerge.data.tasks import TaskSpec
from hf_dpmerge.lora import load_saved_adapter
from hf_dpmerge.modeling.modeling_mean_pooling_bert import modulated
from hf_dpmerge.modeling.task_modulator import modulator_tensors, task_modulator
from hf_dpmerge.records.fingerprint import directory_base_tensors, saved_tensor_names
from hf_dpmerge.records.merge_base import merged_config
from hf_dpmerge.utils.io import apply_open_modes

EMR_METHOD = "emr"


def is_emr_merge(merged_dir: str | os.PathLike) -> bool:
    """Whether ``merged_dir``'s ``mergekit_config.yml`` merged with ``emr``."""
    data = merged_config(merged_dir)
    return isinstance(data, dict) and data.get("merge_method") == EMR_METHOD


def unified_delta(base_dir: str | os.PathLike, merged_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    """δ_uni = W_root − W_0 for every weight the root changed (float32), read from both directories."""
    names = saved_tensor_names(merged_dir)
    root, base = directory_base_tensors(merged_dir, names), directory_base_tensors(base_dir, names)
    return {name: (root[name].float() - base[name].float()) for name in names
            if root[name].shape == base[name].shape and not torch.equal(root[name], base[name])}


def run_modulator(adapter_dir: str | os.PathLike,
                  unified: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], float]:
    """(M_t, λ_t) of the task whose peft adapter (LoRA and head) is ``adapter_dir``: τ_t from its LoRA factors."""
    task_vector = {}
    for name, factor in load_saved_adapter(adapter_dir).factors.items():
        left, right = factor.delta_factors()
        task_vector[name] = left.double() @ right.double()
    return task_modulator(task_vector, unified)


def load_modulated_with_head(merged_dir: str | os.PathLike, adapter_dir: str | os.PathLike, spec: TaskSpec,
                             unified: dict[str, torch.Tensor]):
    """The ``emr`` root with the task's head and its modulator applied (the remote code's ``modulated``, as a stock
    loader of the release applies it), in eval mode."""
    model = load_merged_with_head(merged_dir, adapter_dir, spec)
    state = {name: tensor for name, tensor in model.state_dict().items() if name in unified}
    if missing := sorted(set(unified) - set(state)):
        raise ValueError(f"{merged_dir}: the task model has no weights {missing[:3]} that the emr merge changed")
    model.load_state_dict(modulated(state, unified, modulator_tensors(*run_modulator(adapter_dir, unified))),
                          strict=False)
    return model


def modulate_saved_task_model(model_dir: str | os.PathLike, adapter_dir: str | os.PathLike,
                              unified: dict[str, torch.Tensor]) -> None:
    """Rewrite a task model folder written from the ``emr`` root (its single ``model.safetensors``) as the task's
    modulated model, W_t = W_root + (λ_t·M_t − 1) ⊙ δ_uni."""
    path = Path(model_dir) / "model.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"{model_dir}: an emr task model needs one model.safetensors")
    state = modulated(load_file(path), unified, modulator_tensors(*run_modulator(adapter_dir, unified)))
    save_file({name: tensor.contiguous() for name, tensor in state.items()}, str(path), metadata={"format": "pt"})
    apply_open_modes(path)  # safetensors writes 0600
