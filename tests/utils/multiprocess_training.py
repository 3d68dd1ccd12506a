"""Two-process DPSAMTrainer runs (gloo, CPU) for the multi-process tests.

``spawn_two_processes`` starts a process group with torch.multiprocessing (fast tests); the same module is the
script that the slow test starts with the real ``accelerate launch --multi_gpu --num_processes 2`` (torch's
launcher; the trainers ask for ``use_cpu``, so accelerate joins the processes over gloo). Every process
writes what it saw and ended with to ``<out>/rank{r}.pt``; the tests compare that with 1-process runs.

Two processes × ``PER_PROCESS_BATCH`` = the 1-process B_exp of ``make_trainer`` (20), so q, σ and the seeded
global Poisson draws are the same in both modes.
"""

from __future__ import annotations

import faulthandler
import os
import socket
import sys
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from accelerate import PartialState

from hf_dpmerge.records.record import PrivacyRecord
from tests.utils.training_helpers import (
    collate,
    lora_classifier,
    make_cached_trainer,
    make_trainer,
    text_dataset,
    unit_dataset,
)

SINGLE_PROCESS_BATCH = 20
PER_PROCESS_BATCH = SINGLE_PROCESS_BATCH // 2
CLIPPING = dict(noise_multiplier=0.0, per_sample_max_grad_norm=0.05, physical_batch_size=3, sam_rho=0.0)
NOISE = dict(noise_multiplier=1.3, per_sample_max_grad_norm=0.4)
NOISE_DRAWS = 100
TRAINING = dict(max_steps=6, save_strategy="steps", save_steps=3, sam_mode="dp_sat", sam_rho=0.1, logging_steps=1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def first_draw(trainer) -> list[int]:
    """This process's share of the first Poisson draw of the trainer's loader."""
    return list(next(iter(trainer.get_train_dataloader().batch_sampler)))


def clipped_query(out: Path, sam_mode: str, batch: int) -> dict[str, Any]:
    """Share of the first draw, and the released (σ = 0: clipped, all-processes) mean gradient and loss on it."""
    trainer = make_trainer(out / f"clip_{sam_mode}", per_device_train_batch_size=batch, sam_mode=sam_mode, **CLIPPING)
    rows = first_draw(trainer)
    trainer.model.train()
    released, loss = trainer._query(trainer.model, collate(trainer, rows))
    return {"rows": rows, "released": released, "loss": loss, "expected_batch_size": trainer.expected_batch_size}


def noise_only_queries(out: Path, batch: int) -> list[torch.Tensor]:
    """σC-scaled noise of NOISE_DRAWS empty-draw queries: B_exp · g̃ flattened, zero clipped sum."""
    trainer = make_trainer(out / "noise", per_device_train_batch_size=batch, **NOISE)
    empty = {k: v[:0] for k, v in collate(trainer, [0]).items()}
    draws = []
    for _ in range(NOISE_DRAWS):
        released, _ = trainer._query(trainer.model, empty)
        draws.append(torch.cat([g.reshape(-1) for g in released]) * trainer.expected_batch_size)
    return draws


def training_run(out: Path, batch: int, resume_from: str | None = None) -> dict[str, Any]:
    """TRAINING steps (checkpoints every 3), the adapter saved, predictions on the corpus; what each saw."""
    saved_records: list[str] = []
    original_save = PrivacyRecord.save

    def recording_save(record, directory):
        saved_records.append(str(directory))
        return original_save(record, directory)

    PrivacyRecord.save = recording_save
    try:
        trainer = make_trainer(out, per_device_train_batch_size=batch, **TRAINING)
        trainer.train(resume_from_checkpoint=resume_from)
        trainer.save_model(str(out / "adapter"))
    finally:
        PrivacyRecord.save = original_save
    predictions = trainer.predict(text_dataset(copies=1)).predictions
    return {
        "epsilon": trainer.accountant.epsilon(),
        "steps": trainer.accountant.steps,
        "noise_multiplier": trainer.noise_multiplier,
        "sample_rate": trainer.sample_rate,
        "delta": trainer.delta,
        "params": [p.detach().clone() for p in trainer._params],
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "saved_records": saved_records,
        "predictions": torch.as_tensor(predictions),
    }


def unseeded_sampler_state(out: Path, batch: int) -> torch.Tensor:
    """The Poisson-sampling generator's state when no dp_seed is given (OS entropy)."""
    return make_trainer(out / "unseeded", per_device_train_batch_size=batch, dp_seed=None).sample_generator.get_state()


def unseeded_resumed_sampler_state(out: Path, batch: int, checkpoint: str) -> torch.Tensor:
    """The Poisson-sampling generator's state after an unseeded run resumed from ``checkpoint`` took its steps."""
    trainer = make_trainer(out / "unseeded_resumed", per_device_train_batch_size=batch, dp_seed=None, **TRAINING)
    trainer.train(resume_from_checkpoint=checkpoint)
    return trainer.sample_generator.get_state()


def calibration_error(out: Path, batch: int) -> str:
    """The error every process gets when σ calibration (done by the main process only) fails."""
    try:
        make_trainer(out / "unreachable", per_device_train_batch_size=batch, target_epsilon=1e-9)
    except ValueError as error:
        return str(error)
    return ""


def unit_level_run(out: Path, batch: int) -> dict[str, Any]:
    """User-level DP (units = authors, 2 expected per process and draw): the first draw's share, then 3 steps."""
    trainer = make_trainer(out, dataset=unit_dataset(), privacy_unit_column="author",
                           per_device_train_batch_size=batch // 5, max_steps=3, sam_mode="dp_sat", sam_rho=0.1)
    rows = first_draw(trainer)
    trainer.train()
    params = [p.detach().clone() for p in trainer._params]
    return {"rows": rows, "params": params, "epsilon": trainer.accountant.epsilon(), "sample_rate": trainer.sample_rate}


def cached_run(out: Path, batch: int) -> dict[str, Any]:
    """TRAINING's steps on the cached prefix (LoRA on the tiny BERT's top layer, every process caching the whole
    training set): the final weights and ε."""
    trainer = make_cached_trainer(out, model=lora_classifier(layers_to_transform=[1]),
                                  per_device_train_batch_size=batch, **{**TRAINING, "save_strategy": "no"})
    trainer.train()
    return {"params": [p.detach().clone() for p in trainer._params], "epsilon": trainer.accountant.epsilon()}


def two_process_scenarios(out: Path, single_process_checkpoint: str) -> dict[str, Any]:
    """Everything the fast tests look at, from one process group (start-up dominates the cost)."""
    batch = PER_PROCESS_BATCH
    return {
        "unseeded_sampler_state": unseeded_sampler_state(out, batch),
        "calibration_error": calibration_error(out, batch),
        "clipped": {mode: clipped_query(out, mode, batch) for mode in ("none", "per_example")},
        "noise": noise_only_queries(out, batch),
        "full": training_run(out / "full", batch),
        "resumed": training_run(out / "resumed", batch, str(out / "full" / "out" / "checkpoint-3")),
        "resumed_from_single": training_run(out / "from_single", batch, single_process_checkpoint),
        "unseeded_resumed_sampler_state": unseeded_resumed_sampler_state(
            out, batch, str(out / "full" / "out" / "checkpoint-3")),
        "unit_level": unit_level_run(out / "units", batch),
        "cached": cached_run(out / "cached", batch),
    }


def _process(rank: int, world_size: int, port: int, out: str, single_process_checkpoint: str) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    results = two_process_scenarios(Path(out), single_process_checkpoint)
    torch.save(results, Path(out) / f"rank{rank}.pt")
    leave_process_group()


def leave_process_group() -> None:
    """Leave together and release the process group (a process leaving early can abort in gloo)."""
    PartialState().wait_for_everyone()
    PartialState().destroy_process_group()


def spawn_two_processes(out: Path, single_process_checkpoint: str) -> list[dict[str, Any]]:
    mp.spawn(_process, args=(2, free_port(), str(out), single_process_checkpoint), nprocs=2, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


if __name__ == "__main__":  # accelerate launch ... --module tests.utils.multiprocess_training OUT
    faulthandler.enable(all_threads=True)  # a rare abort in gloo's teardown then shows where it struck
    target = Path(sys.argv[1])
    result = training_run(target, PER_PROCESS_BATCH)
    torch.save(result, target / f"rank{int(os.environ['RANK'])}.pt")
    leave_process_group()
