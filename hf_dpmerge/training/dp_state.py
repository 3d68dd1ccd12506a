"""DP state in checkpoints: accountant history, g̃_{t−1} (dp_sat), Σ η², and sampling/noise generators.

Written beside every Trainer checkpoint (``dp_state.pt``) so that ``resume_from_checkpoint`` continues ε
instead of resetting it, and the next Poisson draw and noise are those of an uninterrupted run.

In a multi-process run all of it is global: the accountant, g̃_{t−1} and Σ η² are identical on every process,
the sampling generator runs identically everywhere, and only the main process draws noise. So the saving
process writes one file and every process loads it on resume, whatever the number of processes either run had
(the sample rate q = B_exp/N must match, which the accountant checks).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

if TYPE_CHECKING:
    from hf_dpmerge.training.dpsam_trainer import DPSAMTrainer

DP_STATE_NAME = "dp_state.pt"


def dp_state(trainer: DPSAMTrainer) -> dict[str, Any]:
    return {
        "accountant": trainer.accountant.state_dict() if trainer.accountant is not None else None,
        "previous_gradient": trainer.previous_gradient,
        "sum_lr_squared": trainer.sum_lr_squared,
        "sample_generator": trainer.sample_generator.get_state(),
        "noise_generator": trainer.noise_generator.get_state(),
    }


def save_dp_state(trainer: DPSAMTrainer, directory: str | os.PathLike) -> None:
    target = Path(directory) / DP_STATE_NAME
    tmp = target.with_suffix(".tmp")
    torch.save(dp_state(trainer), tmp)
    os.replace(tmp, target)


def load_dp_state(trainer: DPSAMTrainer, path: str | os.PathLike) -> None:
    state = torch.load(path, weights_only=False)
    if (state["accountant"] is None) != (trainer.accountant is None):
        raise ValueError(f"{path}: checkpoint and run disagree on whether training is private (dp)")
    if trainer.accountant is not None:
        trainer.accountant.load_state_dict(state["accountant"])
    trainer.previous_gradient = state["previous_gradient"]
    trainer.sum_lr_squared = state["sum_lr_squared"]
    trainer.sample_generator.set_state(state["sample_generator"])
    trainer.noise_generator.set_state(state["noise_generator"])


class DPStateCallback(TrainerCallback):
    """Saves the DP state with each checkpoint and stops training before the ε budget is exceeded."""

    def __init__(self, trainer: DPSAMTrainer):
        self.trainer = trainer

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        accountant = self.trainer.accountant
        if accountant is not None and accountant.steps >= self.trainer.allowed_steps:
            if state.global_step < state.max_steps:
                self.trainer.log({"dp_budget_exhausted": 1.0})
            control.should_training_stop = True
        return control

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if args.should_save:
            save_dp_state(self.trainer, Path(args.output_dir) / f"checkpoint-{state.global_step}")
        return control
