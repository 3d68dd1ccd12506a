"""Poisson-sampled logical batches: one independent draw per optimizer step (DESIGN-NOTES §3).

Each example joins a step's batch independently with probability q = B_exp/N (opacus
``UniformWithReplacementSampler``). A draw may be empty; it is collated as a batch of zero rows so the
step still adds noise and is still accounted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from torch.utils.data import DataLoader, Dataset


class EmptySafeCollator:
    """Wrap a collator so that an empty draw yields the same keys with a leading dimension of 0."""

    def __init__(self, collate_fn: Callable[[list[Any]], dict[str, Any]], dataset: Dataset):
        self.collate_fn = collate_fn
        self.dataset = dataset

    def __call__(self, features: Sequence[Any]) -> dict[str, Any]:
        if len(features) > 0:
            return self.collate_fn(list(features))
        template = self.collate_fn([self.dataset[0]])
        return {k: v[:0] if isinstance(v, torch.Tensor) else v for k, v in template.items()}


def poisson_dataloader(
    dataset: Dataset,
    collate_fn: Callable[[list[Any]], dict[str, Any]],
    *,
    sample_rate: float,
    steps: int,
    generator: torch.Generator,
    num_workers: int = 0,
) -> DataLoader:
    """A DataLoader yielding ``steps`` Poisson draws per pass (a pass is one Trainer epoch)."""
    sampler = UniformWithReplacementSampler(
        num_samples=len(dataset), sample_rate=sample_rate, generator=generator, steps=steps
    )
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=EmptySafeCollator(collate_fn, dataset),
        num_workers=num_workers,
    )
