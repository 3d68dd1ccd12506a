"""Reference-point alignment penalty on LoRA deltas (DP-Merging §4, adapted to LoRA; docs/design.md §4).

    R(w) = λ · Σ_layers ‖ΔW‖_F²,   ΔW = s·B·A  (s = α/r, or α/√r with rsLoRA)

    ‖s·B·A‖_F² = s² · Σ_ij (BᵀB)_ij (A Aᵀ)_ij

uses r×r Gram matrices only and never materialises the d_out×d_in delta. R does not depend on data, so its
gradient is added to the privatised gradient after the noise (post-processing; no privacy cost).
Task heads (``modules_to_save``) are not penalised: each task keeps its own head and only the encoder's
deltas are merged, so head drift does not enter the merge gap — and pulling a freshly initialised head back
to its random start only slows the few, noisy DP steps it gets.
"""

from __future__ import annotations

import torch
from torch import nn

from hf_dpmerge.lora import UnsupportedAdapterError, lora_delta_sq_norm, lora_factors


def alignment_penalty(model: nn.Module, align_lambda: float) -> torch.Tensor:
    """λ·Σ‖s·B·A‖_F², differentiable w.r.t. the LoRA factors."""
    terms = [lora_delta_sq_norm(f) for f in lora_factors(model)]
    if not terms:
        raise UnsupportedAdapterError("the model has no LoRA layers to align")
    return align_lambda * torch.stack(terms).sum()
