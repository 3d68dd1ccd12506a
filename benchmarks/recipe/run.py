"""Train and score one unit of the recipe benchmark (in this process), and store its result."""

from __future__ import annotations

import dataclasses
import gc
import json
import platform
import shutil
import time
from pathlib import Path
from typing import Any

from hf_dpmerge.scripts import train as train_script
from hf_dpmerge.utils.io import write_text_atomic

from .grid import BASE_FLAGS, RECIPES, Unit

REPO = Path(__file__).resolve().parents[2]
UNITS_DIR = REPO / "benchmarks" / "reports" / "recipe" / "units"
NON_PRIVATE_FLAGS = ("--dp", "false", "--sam_mode", "none", "--align_lambda", "0")


def train_arguments(unit: Unit, runs_dir: Path) -> list[str]:
    """The unit's train_glue.py command line: :data:`.grid.BASE_FLAGS`, the recipe's flags, then the unit's (later
    flags win over these and over the script's own defaults)."""
    argv = [*BASE_FLAGS, *RECIPES[unit.recipe].flags, "--task", unit.task, "--seed", str(unit.seed),
            "--runs_dir", str(runs_dir), "--overwrite", "true", "--disable_tqdm", "true"]
    argv += list(NON_PRIVATE_FLAGS) if unit.epsilon is None else ["--target_epsilon", f"{unit.epsilon:g}"]
    return argv


def unit_path(unit: Unit, units_dir: Path = UNITS_DIR) -> Path:
    return units_dir / f"{unit.name}.json"


def load_result(unit: Unit, units_dir: Path = UNITS_DIR) -> dict[str, Any] | None:
    """The stored result of ``unit`` if it was trained with the command line the grid gives it today."""
    path = unit_path(unit, units_dir)
    if not path.is_file():
        return None
    result = json.loads(path.read_text())
    return result if result["argv"] == train_arguments(unit, Path("<runs>")) else None


def validation_metrics(task: str, runs_dir: Path, base_dir: Path) -> dict[str, float]:
    """The metrics of ``runs_dir/<task>/adapter`` (loaded as a user loads it) on the task's validation split."""
    from hf_dpmerge.analysis.evaluation import predict_logits
    from hf_dpmerge.analysis.task_models import load_individual_model
    from hf_dpmerge.data import compute_metrics, load_task, predictions_from_logits, tokenize_task
    from hf_dpmerge.records.record import PrivacyRecord

    record = PrivacyRecord.load(runs_dir / task / "adapter")
    splits, spec = load_task(task)
    tokenizer = train_script.AutoTokenizer.from_pretrained(base_dir)
    data = tokenize_task(splits["validation"], spec, tokenizer, max_length=int(record.extra["max_length"]))
    model = load_individual_model(base_dir, runs_dir / task / "adapter", spec)
    logits = predict_logits(model, data, tokenizer, batch_size=128)
    return compute_metrics(spec, predictions_from_logits(spec, logits), data["labels"])


def score(unit: Unit, runs_dir: Path, base_dir: Path) -> dict[str, float]:
    """The unit's adapter scored on its split: test from the script's own eval_metrics.json, validation here."""
    if unit.split == "test":
        return json.loads((runs_dir / unit.task / "eval_metrics.json").read_text())["test"]
    return validation_metrics(unit.task, runs_dir, base_dir)


def train_in_process(task: str, argv: list[str], seed: int, work_dir: Path) -> tuple[dict[str, Any], float, Path]:
    """Train ``task`` with train_glue.py's ``argv`` in this process, from one base shared under ``work_dir``:
    (the script's summary, training seconds, the base directory)."""
    from transformers import set_seed

    run = train_script.plan_runs(argv)[task]
    base_dir = train_script.shared_base(dataclasses.replace(run.script, runs_dir=str(work_dir)))
    set_seed(seed)
    start = time.perf_counter()
    summary = train_script.train_task(task, *run, base_dir)
    return summary, time.perf_counter() - start, base_dir


def run_unit(unit: Unit, work_dir: Path, units_dir: Path = UNITS_DIR) -> dict[str, Any]:
    """Train ``unit`` under ``work_dir`` (its adapter is deleted afterwards), score it and store the result."""
    runs_dir = work_dir / unit.name.replace("/", "-")
    summary, seconds, base_dir = train_in_process(unit.task, train_arguments(unit, runs_dir), unit.seed, work_dir)
    metrics = score(unit, runs_dir, base_dir)
    result = {
        "unit": dataclasses.asdict(unit), "argv": train_arguments(unit, Path("<runs>")), "split": unit.split,
        "metrics": metrics, "train_seconds": seconds, "epsilon": summary["epsilon"], "delta": summary["delta"],
        "steps": summary["steps"], "host": {"machine": platform.machine(), "cpus": _cpus()},
    }
    write_text_atomic(unit_path(unit, units_dir), json.dumps(result, indent=1, allow_nan=True) + "\n")
    shutil.rmtree(runs_dir, ignore_errors=True)
    gc.collect()
    return result


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
