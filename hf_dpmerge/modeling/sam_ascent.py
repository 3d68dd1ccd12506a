"""The SAM ascent step and its bit-exact restore, shared by training's sharpness-aware step
(:mod:`hf_dpmerge.training.sam`) and the sharpness measurement (:mod:`hf_dpmerge.analysis.sharpness`).

    e = ρ·d/‖d‖ over all tensors jointly;   w ← w + e inside the block, the saved w copied back on exit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import nn


def ascent_step(direction: Sequence[torch.Tensor], rho: float) -> list[torch.Tensor] | None:
    """e = ρ·d/‖d‖ over all tensors jointly; None when ρ = 0 or d = 0."""
    norm = torch.sqrt(sum(d.pow(2).sum() for d in direction))
    if rho == 0 or norm == 0:
        return None
    return [rho * d / norm for d in direction]


@contextlib.contextmanager
def perturbed(params: Sequence[nn.Parameter], step: Sequence[torch.Tensor] | None) -> Iterator[None]:
    """Temporarily set w ← w + e; the original values are copied back on exit."""
    if step is None:
        yield
        return
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, e in zip(params, step):
            p.add_(e)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, original in zip(params, saved):
                p.copy_(original)
