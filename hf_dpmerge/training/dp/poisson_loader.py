"""Poisson-sampled logical batches: one independent draw per optimizer step (docs/design.md §3).

Each example joins a step's batch independently with probability q = B_exp/N (opacus
``UniformWithReplacementSampler``); an empty draw is collated as a batch of zero rows, so the step still adds noise
and is still accounted. With P processes every process makes the same global draw and keeps positions r, r+P, …
of it (:class:`ProcessShareSampler`): the step is the single-process mechanism whatever P is, and every process
yields a batch at every step. User-level (``unit_of_row`` given): each *unit* joins with probability
q = B_exp/N_units and brings all its rows (:class:`UnitPoissonSampler`), a unit's rows on one process, and each
batch carries ``UNIT_KEY`` for per-unit clipping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
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


UNIT_KEY = "dp_privacy_unit"  # batch key holding each row's unit code (popped before the forward pass)


class UnitPoissonSampler(Sampler[list[int]]):
    """``steps`` draws; each draw takes every unit with probability ``sample_rate`` and yields the rows of the
    sampled units (grouped by unit), keeping units ``process_index``, ``process_index + num_processes``, …"""

    def __init__(
        self,
        unit_of_row: np.ndarray,
        *,
        sample_rate: float,
        steps: int,
        generator: torch.Generator,
        num_processes: int = 1,
        process_index: int = 0,
    ):
        if not 0 <= process_index < num_processes:
            raise ValueError(f"process_index must lie in [0, {num_processes}), got {process_index}")
        order = np.argsort(unit_of_row, kind="stable")
        bounds = np.searchsorted(unit_of_row[order], np.arange(int(unit_of_row.max()) + 2))
        self.rows_of_unit = [order[bounds[u] : bounds[u + 1]].tolist() for u in range(len(bounds) - 1)]
        self.sample_rate = sample_rate
        self.steps = steps
        self.generator = generator
        self.num_processes = num_processes
        self.process_index = process_index

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.steps):
            drawn = torch.rand(len(self.rows_of_unit), generator=self.generator) < self.sample_rate
            units = drawn.nonzero().flatten().tolist()[self.process_index :: self.num_processes]
            yield [row for unit in units for row in self.rows_of_unit[unit]]


class RowsWithUnit(Dataset):
    """``dataset`` whose item i is (row i, unit code of row i)."""

    def __init__(self, dataset: Dataset, unit_of_row: np.ndarray):
        self.dataset = dataset
        self.unit_of_row = unit_of_row

    def __len__(self) -> int:
        return len(self.unit_of_row)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        return self.dataset[index], int(self.unit_of_row[index])


class UnitCollator:
    """Collate (row, unit) pairs: the wrapped collator's batch plus ``UNIT_KEY`` (a LongTensor of unit codes)."""

    def __init__(self, collate_fn: Callable[[list[Any]], dict[str, Any]]):
        self.collate_fn = collate_fn

    def __call__(self, items: Sequence[tuple[Any, int]]) -> dict[str, Any]:
        batch = self.collate_fn([row for row, _ in items])
        return {**batch, UNIT_KEY: torch.tensor([unit for _, unit in items], dtype=torch.long)}


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
    unit_of_row: np.ndarray | None = None,
) -> DataLoader:
    """A DataLoader yielding ``steps`` Poisson draws per pass (a pass is one Trainer epoch); with several
    processes, this process's share of each draw (``generator`` must be in the same state on all of them).
    With ``unit_of_row`` (codes 0..N_units−1, one per row) the draws sample units and batches carry ``UNIT_KEY``."""
    sampler: Sampler[list[int]]
    if unit_of_row is not None:
        sampler = UnitPoissonSampler(
            unit_of_row, sample_rate=sample_rate, steps=steps, generator=generator,
            num_processes=num_processes, process_index=process_index,
        )
        dataset, collate_fn = RowsWithUnit(dataset, unit_of_row), UnitCollator(collate_fn)
    else:
        sampler = UniformWithReplacementSampler(
            num_samples=len(dataset), sample_rate=sample_rate, generator=generator, steps=steps
        )
        # not opacus' DistributedUniformWithReplacementSampler: it skips empty local draws, which would put the
        # processes' step counts, and their all-reduces, out of step
        if num_processes > 1:
            sampler = ProcessShareSampler(sampler, num_processes=num_processes, process_index=process_index)
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=EmptySafeCollator(collate_fn, dataset),
        num_workers=num_workers,
    )
