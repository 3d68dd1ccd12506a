"""EMR-Merging (Huang et al., NeurIPS 2024, arXiv 2405.17461, §3.2), its merge step: elect one unified task vector

    γ = sgn(Σ_t τ_t),      ε_j = max_t {|τ_t,j| : sgn(τ_t,j) = γ_j} (0 where none agrees),      τ_uni = γ ⊙ ε,

output W_0 + λ·τ_uni (λ = 1, the paper's). The per-task masks M_t = [τ_t ⊙ τ_uni > 0] and rescalers λ_t = Σ|τ_t| /
Σ|M_t ⊙ τ_uni| that turn the root into each task's model, W_t = W_0 + λ_t·M_t ⊙ τ_uni, are computed from the
released adapters and the root (:mod:`hf_dpmerge.modeling.task_modulator`); they are stored beside each task's head.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def emr_elect(task_vectors: Sequence[torch.Tensor]) -> torch.Tensor:
    """τ_uni of the module docstring, elementwise over same-shaped task vectors."""
    stacked = torch.stack(list(task_vectors))
    sign = torch.sign(stacked.sum(dim=0))
    agreeing = stacked * sign > 0
    return sign * torch.where(agreeing, stacked.abs(), torch.zeros_like(stacked)).amax(dim=0)
