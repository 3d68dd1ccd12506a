"""DP state in checkpoints: accountant history, g̃_{t−1} (dp_sat), Σ η², and sampling/noise generators.

Written into every Trainer checkpoint (``dp_state.pt``) so that ``resume_from_checkpoint`` continues ε
instead of resetting it, and the next Poisson draw and noise are those of an uninterrupted run. It is
written with the checkpoint's model, before the optimizer and ``trainer_state.json``, which the Trainer
writes last and before it deletes older checkpoints; so a checkpoint is complete when it holds both, and
a process killed while writing one leaves an earlier complete checkpoint to resume from. The noise
generator's state would let anyone who holds it recompute past noise, so it is written into checkpoints
only, never beside a released or pushed adapter.

In a multi-process run all of it is global: the accountant, g̃_{t−1} and Σ η² are identical on every process,
the sampling generator runs identically everywhere, and only the main process draws noise. So the saving
process writes one file and every process loads it on resume, whatever the number of processes either run had
(the sample rate q = B_exp/N must match, which the accountant checks).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from hf_dpmerge.training.dp.accounting import PrivacyAccountant
from hf_dpmerge.utils.io import write_bytes_atomic

DP_STATE_NAME = "dp_state.pt"


class DPSAMTrainer(Protocol):
    """What this module reads and restores of a :class:`~hf_dpmerge.training.dpsam_trainer.DPSAMTrainer`."""

    accountant: PrivacyAccountant | None
    allowed_steps: int
    previous_gradient: list[torch.Tensor] | None
    sum_lr_squared: float
    sample_generator: torch.Generator
    noise_generator: torch.Generator
    state: TrainerState

    def log(self, logs: dict[str, float]) -> None: ...


def dp_state(trainer: DPSAMTrainer) -> dict[str, Any]:
    return {
        "accountant": trainer.accountant.state_dict() if trainer.accountant is not None else None,
        "previous_gradient": trainer.previous_gradient,
        "sum_lr_squared": trainer.sum_lr_squared,
        "sample_generator": trainer.sample_generator.get_state(),
        "noise_generator": trainer.noise_generator.get_state(),
    }


def save_dp_state(trainer: DPSAMTrainer, directory: str | os.PathLike) -> None:
    buffer = io.BytesIO()
    torch.save(dp_state(trainer), buffer)
    write_bytes_atomic(Path(directory) / DP_STATE_NAME, buffer.getvalue())


def save_checkpoint_dp_state(trainer: DPSAMTrainer, directory: str | os.PathLike) -> None:
    """``save_dp_state`` when ``directory`` is the Trainer's checkpoint of the current step (not push_to_hub's)."""
    if Path(directory).name == f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}":
        save_dp_state(trainer, directory)


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


def missing_checkpoint_files(checkpoint: str | os.PathLike) -> list[str]:
    """The files a complete checkpoint has and ``checkpoint`` lacks."""
    return [name for name in (DP_STATE_NAME, TRAINER_STATE_NAME) if not (Path(checkpoint) / name).is_file()]


def last_complete_checkpoint(output_dir: str | os.PathLike) -> Path:
    """The highest-step ``checkpoint-N`` in ``output_dir`` that holds both DP and Trainer state."""
    directory = Path(output_dir)
    steps = sorted(
        (int(p.name.rsplit("-", 1)[1]), p)
        for p in (directory.glob(f"{PREFIX_CHECKPOINT_DIR}-*") if directory.is_dir() else [])
        if p.is_dir() and p.name.rsplit("-", 1)[1].isdigit()
    )
    for _, checkpoint in reversed(steps):
        if not missing_checkpoint_files(checkpoint):
            return checkpoint
    raise ValueError(
        f"no complete checkpoint (with {DP_STATE_NAME} and {TRAINER_STATE_NAME}) in {directory} to resume from"
    )


def mid_epoch_checkpoint(checkpoint: str | os.PathLike, steps_per_epoch: int) -> Path | None:
    """``checkpoint`` if it was written mid-epoch, else None.

    Trainer restores a checkpoint's RNG states (``rng_state.pth``: torch, CUDA, numpy, python) at the start of
    the resumed epoch, before creating the epoch's data iterator, which draws from torch's generator. That
    matches an uninterrupted run only at an epoch boundary; mid-epoch the states must be restored again just
    before the first resumed step, or dropout masks differ from the uninterrupted run's.
    """
    state = TrainerState.load_from_json(str(Path(checkpoint) / TRAINER_STATE_NAME))
    return Path(checkpoint) if state.global_step % steps_per_epoch else None


class DPStateCallback(TrainerCallback):
    """Restores the RNG states before the first step resumed mid-epoch; stops before the ε budget is exceeded."""

    def __init__(self, trainer: DPSAMTrainer):
        self.trainer = trainer

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if self.trainer.rng_checkpoint is not None:
            self.trainer._load_rng_state(str(self.trainer.rng_checkpoint))
            self.trainer.rng_checkpoint = None
        return control

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        accountant = self.trainer.accountant
        if accountant is not None and accountant.steps >= self.trainer.allowed_steps:
            if state.global_step < state.max_steps:
                self.trainer.log({"dp_budget_exhausted": 1.0})
            control.should_training_stop = True
        return control
