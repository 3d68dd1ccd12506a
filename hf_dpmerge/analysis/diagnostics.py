"""Geometry diagnostics of trained adapters and a merged model (DP-Merging §3.2, Figure 2): ``hf-dpmerge diagnose``.

For each task of a runs layout (:mod:`hf_dpmerge.analysis.task_run`), on a split of the task's data:

- **sharpness** Sharp_t = L_t(w + ρ∇L/‖∇L‖) − L_t(w) and the **top Hessian eigenvalue** of the adapter's
  parameters (:mod:`hf_dpmerge.analysis.sharpness`);
- **drift** ‖ΔW‖_F/‖W_0‖_F per adapted matrix and in total (:mod:`hf_dpmerge.analysis.drift`);
- with a merged model: the **merge gap** Gap_t = L_t(w_merge) − L_t(w_t) and the **interpolation curve**
  L_t((1−γ)w_t + γw_merge) (:mod:`hf_dpmerge.analysis.interpolation`).

Results go to ``diagnostics.json`` and, with a merged model, ``interpolation.png``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hf_dpmerge.analysis.batching import length_sorted_batches
from hf_dpmerge.analysis.drift import AdapterDrift, adapter_drift
from hf_dpmerge.analysis.interpolation import (
    DEFAULT_GAMMAS,
    InterpolationCurve,
    interpolation_curve,
    interpolation_gammas,
    plot_interpolation,
)
from hf_dpmerge.analysis.sharpness import Sharpness, TopEigenvalue, hessian_top_eigenvalue, sharpness
from hf_dpmerge.analysis.task_models import (
    load_individual_model,
    load_merged_with_head,
    load_task_adapter,
    resolve_device,
)
from hf_dpmerge.analysis.task_run import check_model_dirs, find_tokenizer, load_split, task_runs
from hf_dpmerge.records.run_folders import BASE_DIR

RESULTS_NAME = "diagnostics.json"
CHART_NAME = "interpolation.png"
PRIVACY_NOTE = (
    "Diagnostics are computed on the evaluation data given to them. When that data is private, these numbers "
    "and plots are NOT covered by the adapters' differential-privacy guarantee: releasing them can leak "
    "information about it. Compute them on data you may disclose, or keep them private."
)
SUMMARY_KEYS = ("sharpness", "hessian_top_eigenvalue", "drift", "merge_gap")


@dataclass
class TaskDiagnostics:
    """One task's diagnostics; a part not computed is None."""

    task: str
    epsilon: float
    split: str
    num_examples: int
    sharpness: Sharpness | None = None
    hessian: TopEigenvalue | None = None
    drift: AdapterDrift | None = None
    interpolation: InterpolationCurve | None = None

    def summary(self) -> dict[str, float | None]:
        """The scalar diagnostics: Sharp_t, λ_max, total drift, Gap_t."""
        return {
            "sharpness": None if self.sharpness is None else self.sharpness.value,
            "hessian_top_eigenvalue": None if self.hessian is None else self.hessian.value,
            "drift": None if self.drift is None else self.drift.total,
            "merge_gap": None if self.interpolation is None else self.interpolation.merge_gap,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "epsilon": self.epsilon,
            "split": self.split,
            "num_examples": self.num_examples,
            **self.summary(),
            "sharpness_detail": None if self.sharpness is None else self.sharpness.to_dict(),
            "hessian_detail": None if self.hessian is None else self.hessian.to_dict(),
            "drift_detail": None if self.drift is None else self.drift.to_dict(),
            "interpolation": None if self.interpolation is None else self.interpolation.to_dict(),
        }


@dataclass
class DiagnosticsReport:
    """Per-task diagnostics and the settings they were computed with; averages are unweighted over tasks."""

    tasks: list[TaskDiagnostics]
    settings: dict[str, Any]

    def averages(self) -> dict[str, float | None]:
        means = {}
        for key in SUMMARY_KEYS:
            values = [v for t in self.tasks if (v := t.summary()[key]) is not None and not math.isnan(v)]
            means[key] = float(np.mean(values)) if values else None
        return means

    def to_dict(self) -> dict[str, Any]:
        return {
            "tasks": {t.task: t.to_dict() for t in self.tasks},
            "average": self.averages(),
            "settings": self.settings,
            "privacy_note": PRIVACY_NOTE,
            "definitions": {
                "sharpness": "L(w + rho * g/|g|) - L(w), g the full-set gradient over the adapter parameters",
                "hessian_top_eigenvalue": "largest eigenvalue of the loss Hessian over the adapter parameters",
                "drift": "sqrt(sum |s B A|_F^2) / sqrt(sum |W_0|_F^2) over the LoRA-adapted matrices",
                "merge_gap": "L(merged encoder + task head) - L(task model)",
                "interpolation": "L((1 - gamma) * w_task + gamma * w_merged) for each gamma",
            },
        }

    def save(self, directory: str | os.PathLike) -> list[Path]:
        """Write ``diagnostics.json`` (and ``interpolation.png`` when there are curves); return the paths."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        json_path = directory / RESULTS_NAME
        json_path.write_text(json.dumps(self.to_dict(), indent=2, allow_nan=True) + "\n")
        curves = {t.task: {"": t.interpolation} for t in self.tasks if t.interpolation is not None}
        return [json_path] + ([plot_interpolation(curves, directory / CHART_NAME)] if curves else [])

    def table(self) -> str:
        """A plain-text table of the scalar diagnostics of every task and their averages."""
        header = f"{'task':<18} {'ε':>6} {'sharpness':>10} {'λ_max':>10} {'drift':>9} {'merge gap':>10}"
        lines = [header, "-" * len(header)]

        def row(name: str, eps: str, values: dict[str, float | None]) -> str:
            cells = ["–" if v is None else f"{v:.4g}" for v in (values[k] for k in SUMMARY_KEYS)]
            return f"{name:<18} {eps:>6} {cells[0]:>10} {cells[1]:>10} {cells[2]:>9} {cells[3]:>10}"

        for t in self.tasks:
            lines.append(row(t.task, "∞" if math.isinf(t.epsilon) else f"{t.epsilon:.2f}", t.summary()))
        lines.append(row("average", "", self.averages()))
        return "\n".join(lines)


def diagnose_runs(
    runs_dir: str | os.PathLike,
    merged_dir: str | os.PathLike | None = None,
    tasks: Sequence[str] | None = None,
    *,
    geometry: bool = True,
    split: str = "validation",
    max_samples: int | None = None,
    rho: float = 0.05,
    gammas: Sequence[float] = DEFAULT_GAMMAS,
    hessian_iterations: int = 20,
    hessian_tolerance: float = 1e-3,
    base_dir: str | os.PathLike | None = None,
    tokenizer=None,
    max_length: int | None = None,
    data_seed: int | None = None,
    batch_size: int = 32,
    glue_path: str | None = None,
    device: str | torch.device | None = None,
    seed: int = 0,
    log=print,
) -> DiagnosticsReport:
    """Diagnose ``<runs>/<task>/adapter`` (on ``<runs>/base``) and, if given, the merged model, on ``split``.

    ``geometry`` computes each adapter's sharpness, top Hessian eigenvalue (skipped when
    ``hessian_iterations`` is 0) and drift; ``merged_dir`` adds the merge gap and interpolation curve.
    Runs, split seed and ``max_length`` are resolved as :func:`~hf_dpmerge.analysis.evaluation.evaluate_runs`
    does; ``max_samples`` takes a seeded stratified subset of the split. ``seed`` seeds the power iteration.
    """
    runs_dir = Path(runs_dir)
    merged_dir = None if merged_dir is None else Path(merged_dir)
    base_dir = runs_dir / BASE_DIR if base_dir is None else Path(base_dir)
    if merged_dir is None and not geometry:
        raise ValueError("nothing to diagnose: pass a merged model or keep geometry on")
    if hessian_iterations < 0:
        raise ValueError(f"hessian_iterations must be ≥ 0, got {hessian_iterations}")
    gammas = interpolation_gammas(gammas)
    check_model_dirs(base_dir, merged_dir)
    device = resolve_device(device)
    results = []
    for run in task_runs(runs_dir, tasks, data_seed=data_seed, max_length=max_length, merged_dir=merged_dir):
        tok = tokenizer or find_tokenizer([run.adapter_dir, base_dir] + ([merged_dir] if merged_dir else []))
        data = load_split(run, split, tok, max_samples=max_samples, glue_path=glue_path)
        batches = length_sorted_batches(data, tok, batch_size)
        row = TaskDiagnostics(task=run.task, epsilon=float(run.record.epsilon if run.record.dp else math.inf),
                              split=split, num_examples=len(data))
        if geometry:
            adapter = load_task_adapter(base_dir, run.adapter_dir, run.spec, trainable=True).to(device)
            params = [p for p in adapter.parameters() if p.requires_grad]
            row.sharpness = sharpness(adapter, params, batches, rho)
            if hessian_iterations:
                row.hessian = hessian_top_eigenvalue(adapter, params, batches, max_iterations=hessian_iterations,
                                                     tolerance=hessian_tolerance, seed=seed)
            row.drift = adapter_drift(adapter)
            del adapter
        if merged_dir is not None:
            task_model = load_individual_model(base_dir, run.adapter_dir, run.spec).to(device)
            merged = load_merged_with_head(merged_dir, run.adapter_dir, run.spec).to(device)
            row.interpolation = interpolation_curve(task_model, merged, batches, run.spec, gammas)
            del task_model, merged
        log(f"{run.task}: " + ", ".join(f"{k} {v:.4g}" for k, v in row.summary().items() if v is not None)
            + f" ({split}, n={len(data)})")
        results.append(row)
    settings = {
        "runs": str(runs_dir), "merged_model": None if merged_dir is None else str(merged_dir),
        "base_model": str(base_dir), "split": split, "max_samples": max_samples, "rho": rho,
        "gammas": gammas, "hessian_iterations": hessian_iterations, "hessian_tolerance": hessian_tolerance,
        "seed": seed, "parameters": "adapter parameters: LoRA factors A, B and the task head",
    }
    return DiagnosticsReport(results, settings)
