"""Iterate averaging: release θ̄ = (1/K) Σ_{t > T−K} θ_t, the mean of a run's last K iterates, instead of θ_T.

Every iterate of DP-SGD is covered by its accountant (the guarantee composes over all T noisy steps), so any
function of them is post-processing at no privacy cost (docs/design.md §15.7). A run stopped early by its ε budget
averages the iterates it took after T−K. The noise statistics of the release stay the last iterate's: for SGD's
linear response the average's noise variance is at most theirs.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments


class IterateAverageCallback(TrainerCallback):
    """Sums ``params`` after each step t > ``planned_steps`` − ``last_steps``; at the end of training writes their
    mean into ``params``. A resume inside that window is refused (the sum is not checkpointed)."""

    def __init__(self, params: list[nn.Parameter], last_steps: int, planned_steps: int):
        if last_steps < 1:
            raise ValueError(f"iterate averaging needs last_steps ≥ 1, got {last_steps}")
        self.params, self.first_step = params, max(planned_steps - last_steps, 0) + 1
        self.sums: list[torch.Tensor] | None = None
        self.count = 0  # the iterates summed, and then averaged into the release

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if state.global_step >= self.first_step:
            raise ValueError(f"resuming at step {state.global_step}, inside the iterate-averaging window (steps "
                             f"{self.first_step}–{state.max_steps}), would average only the steps after it: resume "
                             f"from a checkpoint before step {self.first_step}, or set --average_last_steps 0")

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if state.global_step < self.first_step:
            return
        with torch.no_grad():
            if self.sums is None:
                self.sums = [p.detach().clone() for p in self.params]
            else:
                for total, p in zip(self.sums, self.params, strict=True):
                    total.add_(p.detach())
        self.count += 1

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if self.sums is None:
            return
        with torch.no_grad():
            for total, p in zip(self.sums, self.params, strict=True):
                p.copy_(total / self.count)
        self.sums = None  # the release holds the mean; ``count`` says of how many iterates
