"""EMR-Merging's per-task modulators (Huang et al., NeurIPS 2024, arXiv 2405.17461, §3.2): from task t's vector τ_t
and the root's unified delta δ_uni = W_root − W_0 (:mod:`hf_dpmerge.merging.methods.emr` elects it),

    M_t = [τ_t ⊙ δ_uni > 0],      λ_t = Σ|τ_t| / Σ|M_t ⊙ δ_uni|      (sums over every modulated weight),

so that W_t = W_0 + λ_t·M_t ⊙ δ_uni (the remote code's ``modulated``). Functions of the released adapters and the
merge only: post-processing, no privacy cost. The scale of the root (mergekit's λ) cancels in λ_t·δ_uni.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch
from safetensors.torch import save_file

from hf_dpmerge.modeling.modeling_mean_pooling_bert import MODULATOR_SCALE, pack_mask


def task_modulator(task_vector: Mapping[str, torch.Tensor],
                   unified: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], float]:
    """(M_t per weight of ``unified``, λ_t) for one task; a weight τ_t leaves alone gets an all-false mask. λ_t is 0
    when no entry of the mask is set (the task then keeps W_0)."""
    masks, kept, total = {}, 0.0, 0.0
    for name, delta in unified.items():
        tau = task_vector.get(name)
        masks[name] = torch.zeros_like(delta, dtype=torch.bool) if tau is None else (tau.to(delta.dtype) * delta > 0)
        kept += float(delta[masks[name]].abs().double().sum())
        total += 0.0 if tau is None else float(tau.abs().double().sum())
    return masks, total / kept if kept else 0.0


def modulator_tensors(masks: Mapping[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """The remote code's task modulator: each nonzero mask packed eight entries per byte, and λ_t."""
    tensors = {name: pack_mask(mask) for name, mask in masks.items() if bool(mask.any())}
    tensors[MODULATOR_SCALE] = torch.tensor([scale], dtype=torch.float64)
    return tensors


def save_task_modulator(path: str | os.PathLike, masks: Mapping[str, torch.Tensor], scale: float) -> None:
    """:func:`modulator_tensors` saved as safetensors at ``path``."""
    save_file(modulator_tensors(masks, scale), str(path), metadata={"format": "pt"})
