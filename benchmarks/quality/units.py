"""One unit of the quality benchmark: a task's training (with its adapter diagnostics) or a cell's merge (with its
evaluation and interpolation), each stored once by :class:`~.store.Store`."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.merging import merge_config, run_merge
from hf_dpmerge.scripts import train as train_script
from hf_dpmerge.training.recipe import DP_RECIPE

from .grid import DIAGNOSTIC_SPLIT, SHARPNESS_RHO, Cell, Grid, trainer_flags
from .store import Store

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Context:
    grid: Grid
    work_dir: Path
    store: Store
    model: str | None
    keep_models: bool
    log: Callable[[str], None]
    ran: int = 0
    skipped: int = 0

    @property
    def base_dir(self) -> Path:
        return self.work_dir / "base"

    def runs_dir(self, cell: Cell) -> Path:
        return self.work_dir / "cells" / cell.name / "runs"


def train_arguments(ctx: Context, cell: Cell) -> list[str]:
    """The full train_glue.py command line of a cell (DP_RECIPE first; later flags win)."""
    argv = [*DP_RECIPE, *ctx.grid.train_flags, *trainer_flags(cell),
            "--seed", str(cell.seed), "--dp_seed", str(cell.seed), "--disable_tqdm", "true",
            "--runs_dir", str(ctx.runs_dir(cell)), "--overwrite", "true"]  # a unit reruns only when stale
    if cell.epsilon is not None:
        argv += ["--target_epsilon", f"{cell.epsilon:g}"]
    if ctx.grid.max_eval_samples is not None:
        argv += ["--max_eval_samples", str(ctx.grid.max_eval_samples)]
    if ctx.model:
        argv += ["--model_name_or_path", ctx.model]
    return argv


def parse_train_arguments(argv: list[str]) -> tuple[train_script.ScriptArguments, Any]:
    """``argv`` parsed as the training script parses its command line (``argv`` already starts with DP_RECIPE),
    after the one-phase LoRA defaults this benchmark's cells were defined on (not the LP-FT default since)."""
    return train_script.parse_arguments(argv, defaults=train_script.ONE_PHASE_DEFAULTS)


def arguments_set_by(flags: list[str]) -> set[str]:
    """The training script's arguments (dataclass field names) that ``flags`` set, however spelt (dashes,
    ``=``, an abbreviation): parsed over a namespace in which every argument is unset."""
    parser = train_script.argument_parser()
    unset = object()
    namespace = argparse.Namespace(**dict.fromkeys(vars(parser.parse_known_args([])[0]), unset))
    return {name for name, value in vars(parser.parse_known_args(flags, namespace=namespace)[0]).items()
            if value is not unset}


def training_summary(script, config) -> dict[str, Any]:
    """The hyper-parameters a cell actually trains with, as parsed."""
    return {
        "dp": config.dp, "sam_mode": config.sam_mode, "sam_rho": config.sam_rho, "align_lambda": config.align_lambda,
        "learning_rate": config.learning_rate, "head_learning_rate": config.head_learning_rate,
        "per_sample_max_grad_norm": config.per_sample_max_grad_norm,
        "expected_batch_size": config.per_device_train_batch_size, "physical_batch_size": config.physical_batch_size,
        "max_steps": config.max_steps, "lr_scheduler_type": str(config.lr_scheduler_type),
        "weight_decay": config.weight_decay, "max_length": script.max_length, "lora_r": script.lora_r,
        "lora_alpha": script.lora_alpha, "lora_target_modules": script.lora_target_modules,
        "lora_layers": script.lora_layers, "classifier_pooling": script.classifier_pooling,
        "max_train_samples": script.max_train_samples,
    }


def _diagnostic_settings(grid: Grid) -> dict[str, Any]:
    return {"split": DIAGNOSTIC_SPLIT, "max_samples": grid.diagnostic_samples, "rho": SHARPNESS_RHO,
            "hessian_iterations": grid.hessian_iterations, "gammas": list(grid.gammas)}


def _host() -> dict[str, Any]:
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    return {"device": device, "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()}


def unit_settings(ctx: Context, cell: Cell, unit: str) -> dict[str, Any]:
    """What a unit (``train_<task>`` or ``merge_<method>``) is computed from; a stored result counts only if
    its settings equal these. A merge's include its adapters' training settings, so retraining redoes it."""
    kind, name = unit.split("_", 1)
    if kind == "train":
        return {"argv": train_arguments(ctx, cell), "task": name, "diagnostics": _diagnostic_settings(ctx.grid)}
    adapters = [ctx.runs_dir(cell) / task / "encoder_adapter" for task in ctx.grid.tasks]
    return {"merge": merge_config(name, ctx.base_dir, adapters, non_private=cell.trainer == "non_private"),
            "trained": [unit_settings(ctx, cell, f"train_{task}") for task in ctx.grid.tasks],
            "max_eval_samples": ctx.grid.max_eval_samples, "diagnostics": _diagnostic_settings(ctx.grid)}


def pending(ctx: Context, cell: Cell, unit: str, settings: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The unit's settings (``settings``, else :func:`unit_settings`'s) when it still has to run; None (counted
    as skipped) when it is done."""
    settings = unit_settings(ctx, cell, unit) if settings is None else settings
    if ctx.store.load(cell, unit, settings) is not None:
        ctx.skipped += 1
        return None
    ctx.log(f"[{unit}] {cell.name}")
    return settings


def train_unit(ctx: Context, cell: Cell, task: str) -> None:
    """Train one task's adapter in a cell and measure its geometry (skipped when already done)."""
    from transformers import set_seed

    from hf_dpmerge.analysis.diagnostics import diagnose_runs

    settings = pending(ctx, cell, f"train_{task}")
    if settings is None:
        return
    # as the training script's main() plans it, after the one-phase defaults of parse_train_arguments
    run = train_script.plan_runs([*settings["argv"], "--task", task], defaults=train_script.ONE_PHASE_DEFAULTS)[task]
    script, config = run.script, run.config
    base_dir = train_script.shared_base(dataclasses.replace(script, runs_dir=str(ctx.work_dir)))
    set_seed(cell.seed)  # LoRA and head initialisation do not depend on what ran before in this process
    start = time.perf_counter()
    summary = train_script.train_task(task, *run, base_dir)
    trained = time.perf_counter()
    report = diagnose_runs(ctx.runs_dir(cell), None, [task], split=DIAGNOSTIC_SPLIT,
                           max_samples=ctx.grid.diagnostic_samples, rho=SHARPNESS_RHO,
                           hessian_iterations=ctx.grid.hessian_iterations, base_dir=base_dir, log=ctx.log)
    seconds = {"train": trained - start, "diagnostics": time.perf_counter() - trained}
    ctx.ran += 1
    gc.collect()
    ctx.store.save(cell, f"train_{task}", settings, {
        "summary": summary, "diagnostics": report.tasks[0].to_dict(),
        "hyperparameters": training_summary(script, config),
        "seconds": seconds, "host": _host(),
    })


def merge_unit(ctx: Context, cell: Cell, merge: str) -> None:
    """Merge a cell's adapters with one method, then score and diagnose the merge (skipped when done)."""
    from hf_dpmerge.analysis.diagnostics import diagnose_runs
    from hf_dpmerge.analysis.evaluation import evaluate_runs

    runs_dir, tasks = ctx.runs_dir(cell), list(ctx.grid.tasks)
    settings = pending(ctx, cell, f"merge_{merge}")
    if settings is None:
        return
    cell_dir = runs_dir.parent
    merged = cell_dir / "merged" / merge
    start = time.perf_counter()
    run_merge(settings["merge"], cell_dir / f"{merge}.yaml", merged, cell_dir / "lora_cache")
    merged_at = time.perf_counter()
    evaluation = evaluate_runs(runs_dir, merged, tasks, base_dir=ctx.base_dir,
                               max_eval_samples=ctx.grid.max_eval_samples, log=ctx.log)
    evaluated = time.perf_counter()
    diagnostics = diagnose_runs(runs_dir, merged, tasks, geometry=False, split=DIAGNOSTIC_SPLIT,
                                max_samples=ctx.grid.diagnostic_samples, gammas=ctx.grid.gammas,
                                base_dir=ctx.base_dir, log=ctx.log)
    seconds = {"merge": merged_at - start, "evaluation": evaluated - merged_at,
               "diagnostics": time.perf_counter() - evaluated}
    if not ctx.keep_models:
        shutil.rmtree(merged)
    ctx.ran += 1
    gc.collect()
    ctx.store.save(cell, f"merge_{merge}", settings, {
        "evaluation": evaluation.to_dict(),
        "diagnostics": {t.task: {"merge_gap": t.interpolation.merge_gap, "interpolation": t.interpolation.to_dict()}
                        for t in diagnostics.tasks},
        "seconds": seconds, "host": _host(),
    })


def run_cell(ctx: Context, cell: Cell) -> None:
    for task in ctx.grid.tasks:
        train_unit(ctx, cell, task)
    for merge in ctx.grid.merges:
        merge_unit(ctx, cell, merge)
    shutil.rmtree(ctx.runs_dir(cell).parent / "lora_cache", ignore_errors=True)  # full merged copies per adapter
