"""What the processes of a multi-process run (``accelerate launch --num_processes N``) must agree on.

- ``sum_over_processes``: S = Σ_r x_r for a list of tensors, every process receiving the same S. The tensors
  are flattened into one buffer so that a call is a single all-reduce through accelerate's ``reduce`` on the
  process group accelerate initialised (gloo on CPU, NCCL on GPUs).
- ``shared_seed``: one seed for every process; drawn from OS entropy by the main process and broadcast when
  none is given, so that a generator every process must run identically (the global Poisson draw) does.
- ``main_process_value``: a value computed once, by the main process, and broadcast (σ calibration and the
  step budget: seconds of accountant work that must not differ between processes, or they would stop apart).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list

from hf_dpmerge.training.dp.run_streams import entropy_seed

T = TypeVar("T")


def sum_over_processes(accelerator: Accelerator, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Σ over the processes of each tensor (shapes and dtypes kept), as one all-reduce."""
    if accelerator.num_processes == 1:
        return list(tensors)
    dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
    flat = torch.cat([t.detach().reshape(-1).to(dtype) for t in tensors])
    total = accelerator.reduce(flat, reduction="sum")
    chunks = total.split([t.numel() for t in tensors])
    return [chunk.view_as(t).to(t.dtype) for chunk, t in zip(chunks, tensors)]


def shared_seed(accelerator: Accelerator, seed: int | None) -> int:
    """``seed`` itself, or a fresh OS-entropy seed drawn by the main process and broadcast to all."""
    if seed is not None:
        return seed
    return main_process_value(accelerator, entropy_seed)


def main_process_value(accelerator: Accelerator, compute: Callable[[], T]) -> T:
    """``compute()`` run by the main process only, its result (or its exception) broadcast to every process."""
    if accelerator.num_processes == 1:
        return compute()
    outcome: list[tuple[T | None, BaseException | None]] = [(None, None)]
    if accelerator.is_main_process:
        try:
            outcome[0] = (compute(), None)
        except Exception as error:  # re-raised on every process instead of leaving the others waiting
            outcome[0] = (None, error)
    broadcast_object_list(outcome, from_process=0)
    value, error = outcome[0]
    if error is not None:
        raise error
    return value
