"""The DP state of a training run (:class:`DPState`, owned by ``DPSAMTrainer``): accountant history,
g̃_{t−1} (dp_sat), Σ η², the sampling/noise generators and the ε budget; and its checkpoint file.

Every Trainer checkpoint holds ``dp_state.pt``, so ``resume_from_checkpoint`` continues ε instead of resetting it.
With ``dp_seed`` the generators are restored (the next draw and noise are an uninterrupted run's); without it they
are re-seeded from OS entropy (:meth:`DPState.resume`), so two runs resumed from one checkpoint share no noise
after it. The file holds the noise generator's state, so it goes into checkpoints only, never beside a release.
A checkpoint is complete when it holds both ``dp_state.pt`` and ``trainer_state.json`` (written last). In a
multi-process run the state is global: one file, loaded by every process whatever their number. See
docs/design.md §3.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from hf_dpmerge.records.record import find_privacy_record
from hf_dpmerge.training.dp.accounting import PrivacyAccountant, PrivacyBudgetExhausted
from hf_dpmerge.training.dp.run_streams import entropy_seed
from hf_dpmerge.utils.io import write_bytes_atomic

DP_STATE_NAME = "dp_state.pt"


def seeded_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator seeded with ``seed``, or with :func:`entropy_seed` when ``seed`` is None."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed if seed is not None else entropy_seed())
    return generator


@dataclass
class DPState:
    """The DP state of one training run, owned by its ``DPSAMTrainer``.

    ``accountant`` is None for a non-private run (then there is no ε budget and ``allowed_steps`` is None);
    ``previous_gradient`` is g̃_{t−1}, the last privatised gradient (the ``dp_sat`` ascent direction);
    ``sum_lr_squared`` is Σ_t η_t² of the first param group over the steps taken (the privacy record's);
    ``sample_generator`` draws the Poisson batches, ``noise_generator`` the Gaussian noise;
    ``allowed_steps`` is how many steps the ε budget allows (from the configuration, not checkpointed);
    ``rng_checkpoint`` is the checkpoint whose torch/numpy/python RNG states the first step resumed mid-epoch
    restores (None otherwise); ``resumed_from_steps`` are the steps at which this run and the runs it continues
    were resumed and ``seeded_before_resume`` whether the streams before the last resume were seeded (None:
    unknown; False when never resumed): both for the privacy record, read by :meth:`resume` from the
    checkpoint's record, not kept in ``dp_state.pt``.
    """

    sample_generator: torch.Generator
    noise_generator: torch.Generator
    accountant: PrivacyAccountant | None = None
    allowed_steps: int | None = None
    previous_gradient: list[torch.Tensor] | None = None
    sum_lr_squared: float = 0.0
    rng_checkpoint: Path | None = None
    resumed_from_steps: list[int] = field(default_factory=list)
    seeded_before_resume: bool | None = False

    # ------------------------------------------------------------------ budget
    @property
    def budget_spent(self) -> bool:
        """True when the ε budget allows no further step (never for a non-private run)."""
        return self.accountant is not None and self.accountant.steps >= self.allowed_steps

    def check_budget(self) -> None:
        """Refuse a step the ε budget does not allow."""
        if self.budget_spent:
            raise PrivacyBudgetExhausted(
                f"ε budget spent after {self.accountant.steps} steps (ε={self.accountant.epsilon():.3g}); "
                "no further step is allowed"
            )

    def record_step(self, learning_rate: float) -> None:
        """Account one optimizer step taken at ``learning_rate``: the accountant's history and Σ η²."""
        if self.accountant is not None:
            self.accountant.step()
        self.sum_lr_squared += float(learning_rate) ** 2

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """What ``dp_state.pt`` holds: the accountant's history, g̃_{t−1}, Σ η² and both generators' states."""
        return {
            "accountant": self.accountant.state_dict() if self.accountant is not None else None,
            "previous_gradient": self.previous_gradient,
            "sum_lr_squared": self.sum_lr_squared,
            "sample_generator": self.sample_generator.get_state(),
            "noise_generator": self.noise_generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any], source: str = "dp state") -> None:
        """Continue from ``state`` (a :meth:`state_dict`); refused when it and this run disagree on DP."""
        if (state["accountant"] is None) != (self.accountant is None):
            raise ValueError(f"{source}: checkpoint and run disagree on whether training is private (dp)")
        if self.accountant is not None:
            self.accountant.load_state_dict(state["accountant"])
        self.previous_gradient = state["previous_gradient"]
        self.sum_lr_squared = state["sum_lr_squared"]
        self.sample_generator.set_state(state["sample_generator"])
        self.noise_generator.set_state(state["noise_generator"])

    def fresh_streams(self, sample_seed: int) -> None:
        """Re-seed the generators in place: sampling from ``sample_seed`` (one entropy seed shared by every
        process, which must draw identically), noise from :func:`entropy_seed` (drawn by the main process only)."""
        self.sample_generator.manual_seed(sample_seed)
        self.noise_generator.manual_seed(entropy_seed())

    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``directory/dp_state.pt`` atomically (checkpoints only: it holds the noise generator's state)."""
        buffer = io.BytesIO()
        torch.save(self.state_dict(), buffer)
        return write_bytes_atomic(Path(directory) / DP_STATE_NAME, buffer.getvalue())

    def save_checkpoint(self, directory: str | os.PathLike, global_step: int) -> None:
        """:meth:`save` when ``directory`` is the Trainer's checkpoint of ``global_step`` (not push_to_hub's save)."""
        if Path(directory).name == f"{PREFIX_CHECKPOINT_DIR}-{global_step}":
            self.save(directory)

    def load(self, path: str | os.PathLike) -> None:
        """Continue from a ``dp_state.pt`` file."""
        self.load_state_dict(torch.load(path, weights_only=False), source=str(path))

    def resume(self, checkpoint: str | os.PathLike, fresh_sample_seed: int | None) -> None:
        """Continue from a complete ``checkpoint``: load its ``dp_state.pt`` and note the resume (its step, after
        the resumes its privacy record lists; a checkpoint without a record leaves earlier seeding unknown).
        With ``fresh_sample_seed`` (a run without ``dp_seed``) the streams are re-seeded (:meth:`fresh_streams`)."""
        checkpoint = Path(checkpoint)
        self.load(checkpoint / DP_STATE_NAME)
        earlier = find_privacy_record(checkpoint)
        step = TrainerState.load_from_json(str(checkpoint / TRAINER_STATE_NAME)).global_step
        self.resumed_from_steps = [*(earlier.resumed_from_steps if earlier is not None else []), step]
        self.seeded_before_resume = earlier.seeded if earlier is not None else None
        if fresh_sample_seed is not None:
            self.fresh_streams(fresh_sample_seed)


def missing_checkpoint_files(checkpoint: str | os.PathLike) -> list[str]:
    """The files a complete checkpoint has and ``checkpoint`` lacks."""
    # dp_state.pt is written with the model, before the optimizer and trainer_state.json, which the Trainer writes
    # last and before deleting older checkpoints: a process killed mid-write leaves an earlier complete checkpoint
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
    """Restores the RNG states before the first step resumed mid-epoch; stops before the ε budget is exceeded.

    ``load_rng_state(checkpoint)`` restores a checkpoint's RNG states; ``log(logs)`` is the trainer's logger."""

    def __init__(
        self,
        dp_state: DPState,
        load_rng_state: Callable[[str], None],
        log: Callable[[dict[str, float]], None],
    ):
        self.dp_state = dp_state
        self.load_rng_state = load_rng_state
        self.log = log

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if self.dp_state.rng_checkpoint is not None:
            self.load_rng_state(str(self.dp_state.rng_checkpoint))
            self.dp_state.rng_checkpoint = None
        return control

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if self.dp_state.budget_spent:
            if state.global_step < state.max_steps:
                self.log({"dp_budget_exhausted": 1.0})
            control.should_training_stop = True
        return control
