"""Poisson-sampled logical batches: one independent draw per optimizer step (docs/design.md §3).

Each example joins a step's batch independently with probability q = B_exp/N (opacus
``UniformWithReplacementSampler``). A draw may be empty; it is collated as a batch of zero rows so the
step still adds noise and is still accounted.

With P processes every process makes the same global draw (one generator, same seed and state everywhere)
and keeps positions r, r+P, r+2P, … of it: the shares partition one Poisson(q) draw of the whole set, so the
step is the single-process mechanism whatever P is, the shares differ in size by at most one, and every
process yields a batch (possibly empty) at every step, which keeps the collectives in step. opacus'
``DistributedUniformWithReplacementSampler`` (independent draws on a shuffled shard per process) also
yields a Poisson(q) union, but it skips empty local draws, which would leave the processes' step counts,
and their all-reduces, out of step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from torch.utils.data import DataLoader, Dataset, Sampler


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


class ProcessShareSampler(Sampler[list[int]]):
    """Positions ``process_index``, ``process_index + num_processes``, … of each batch of ``batch_sampler``."""

    def __init__(self, batch_sampler: Sampler[list[int]], *, num_processes: int, process_index: int):
        if not 0 <= process_index < num_processes:
            raise ValueError(f"process_index must lie in [0, {num_processes}), got {process_index}")
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.batch_sampler:
            yield list(batch[self.process_index :: self.num_processes])


def poisson_dataloader(
    dataset: Dataset,
    collate_fn: Callable[[list[Any]], dict[str, Any]],
    *,
    sample_rate: float,
    steps: int,
    generator: torch.Generator,
    num_workers: int = 0,
    num_processes: int = 1,
    process_index: int = 0,
) -> DataLoader:
    """A DataLoader yielding ``steps`` Poisson draws per pass (a pass is one Trainer epoch); with several
    processes, this process's share of each draw (``generator`` must be in the same state on all of them)."""
    sampler: Sampler[list[int]] = UniformWithReplacementSampler(
        num_samples=len(dataset), sample_rate=sample_rate, generator=generator, steps=steps
    )
    if num_processes > 1:
        sampler = ProcessShareSampler(sampler, num_processes=num_processes, process_index=process_index)
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=EmptySafeCollator(collate_fn, dataset),
        num_workers=num_workers,
    )
