"""Train and score one unit of the recipe benchmark (in this process), and store its result."""

from __future__ import annotations

import dataclasses
import gc
import json
import platform
import shutil
from pathlib import Path
from typing import Any

from benchmarks.training import NON_PRIVATE_FLAGS, train_in_process, validation_metrics
from hf_dpmerge.utils.io import write_text_atomic

from .grid import BASE_FLAGS, RECIPES, Unit

REPO = Path(__file__).resolve().parents[2]
UNITS_DIR = REPO / "benchmarks" / "reports" / "recipe" / "units"


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


def score(unit: Unit, runs_dir: Path, base_dir: Path) -> dict[str, float]:
    """The unit's adapter scored on its split: test from the script's own eval_metrics.json, validation here."""
    if unit.split == "test":
        return json.loads((runs_dir / unit.task / "eval_metrics.json").read_text())["test"]
    return validation_metrics(unit.task, runs_dir, base_dir)


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
