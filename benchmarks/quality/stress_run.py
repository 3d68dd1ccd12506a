"""The stress grid's units (beside :mod:`.units`'s trainings): the noise arm's noisy adapters, a cell's individual
models scored per example, and each merge method tuned on validation and scored once on test (:mod:`.tuning`).

    noise_<task>    the non-private adapter of the same seed with N(0, σ²) on its LoRA factors (noise cells)
    individual      per-example correctness of each task's own adapter (validation and test subsets)
    tune_<method>   every point of the method's space merged and scored on validation; the chosen one on test
"""

from __future__ import annotations

import gc
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from .grid import Cell
from .merge_space import SPACES, merge_configuration, point_label
from .noise_injection import dense_noise_std, inject_noise
from .scoring import Scorer, accuracy, encode
from .tuning import TEST, VALIDATION, tune
from .units import Context, _host, pending, train_unit, unit_settings


def source_cell(cell: Cell) -> Cell:
    """The cell whose adapters a noise cell perturbs: the non-private cell of the same seed."""
    return Cell("non_private", None, cell.seed)


def stress_settings(ctx: Context, cell: Cell, unit: str) -> dict[str, Any]:
    """What a stress unit is computed from (a stored result counts only if its settings equal these)."""
    stress = ctx.grid.stress
    kind, name = unit.split("_", 1) if "_" in unit else (unit, "")
    if kind == "train":
        return unit_settings(ctx, cell, unit)
    if kind == "noise":
        return {"noise_std": cell.noise_std, "seed": cell.seed, "task": name,
                "source": unit_settings(ctx, source_cell(cell), f"train_{name}")}
    inputs = [stress_settings(ctx, cell, f"{'noise' if cell.noise_std is not None else 'train'}_{task}")
              for task in ctx.grid.tasks]
    caps = {"validation_samples": stress.validation_samples, "max_eval_samples": ctx.grid.max_eval_samples}
    if stress.seed_test_subsets:  # only then: results stored with the shared subset stay valid
        caps["test_subset_seed"] = cell.seed
    if kind == "individual":
        return {"inputs": inputs, **caps}
    if kind == "tune":  # noise cells add each input's per-tensor noise_std, a function of the inputs and σ
        adapters = [ctx.runs_dir(cell) / task / "encoder_adapter" for task in ctx.grid.tasks]
        configs = [merge_configuration(name, point, ctx.base_dir, adapters, non_private=cell.epsilon is None)
                   for point in SPACES[name]]
        return {"configs": configs, "noise_std": cell.noise_std, "random_seed": cell.seed, "inputs": inputs, **caps}
    raise ValueError(f"unknown stress unit {unit!r}")


def _scorer(ctx: Context, cell: Cell) -> Scorer:
    caps = {VALIDATION: ctx.grid.stress.validation_samples, TEST: ctx.grid.max_eval_samples}
    return Scorer(ctx.runs_dir(cell), ctx.base_dir, list(ctx.grid.tasks), caps,
                  test_subset_seed=cell.seed if ctx.grid.stress.seed_test_subsets else None)


def noise_unit(ctx: Context, cell: Cell, task: str) -> None:
    """Write the noise cell's adapter for ``task`` (the source cell's adapter must be trained)."""
    settings = pending(ctx, cell, f"noise_{task}", stress_settings(ctx, cell, f"noise_{task}"))
    if settings is None:
        return
    start = time.perf_counter()
    inject_noise(ctx.runs_dir(source_cell(cell)) / task, ctx.runs_dir(cell) / task, cell.noise_std, cell.seed)
    ctx.ran += 1
    ctx.store.save(cell, f"noise_{task}", settings, {"seconds": {"noise": time.perf_counter() - start},
                                                     "host": _host()})


def individual_unit(ctx: Context, cell: Cell, scorer: Scorer) -> None:
    """Per-example correctness of each task's own adapter on the validation and test subsets."""
    settings = pending(ctx, cell, "individual", stress_settings(ctx, cell, "individual"))
    if settings is None:
        return
    start = time.perf_counter()
    scores = scorer.individual((VALIDATION, TEST))
    ctx.ran += 1
    ctx.store.save(cell, "individual", settings, {
        "accuracy": {split: accuracy(correct) for split, correct in scores.items()},
        "correct": {split: encode(correct) for split, correct in scores.items()},
        **({"examples": {TEST: scorer.example_ids}} if scorer.example_ids else {}),
        "seconds": {"scoring": time.perf_counter() - start}, "host": _host(),
    })


def tune_unit(ctx: Context, cell: Cell, method: str, scorer: Scorer) -> None:
    """Tune ``method`` on validation over its space, then score the chosen merge on test once."""
    from hf_dpmerge.cli.main import main as hf_dpmerge

    settings = pending(ctx, cell, f"tune_{method}", stress_settings(ctx, cell, f"tune_{method}"))
    if settings is None:
        return
    cell_dir = ctx.runs_dir(cell).parent
    noise_std = None
    if cell.noise_std is not None:  # the true per-tensor noise of the clean adapters' ΔW
        source = ctx.runs_dir(source_cell(cell))
        noise_std = [dense_noise_std(source / task / "encoder_adapter", cell.noise_std) for task in ctx.grid.tasks]
    seconds = {"merge": 0.0, "scoring": 0.0}

    def merge(index: int, point: dict[str, Any]) -> Path:
        config = settings["configs"][index]
        if noise_std is not None:
            adapters = [ctx.runs_dir(cell) / task / "encoder_adapter" for task in ctx.grid.tasks]
            config = merge_configuration(method, point, ctx.base_dir, adapters, non_private=True, noise_std=noise_std)
        path = cell_dir / "configs" / f"{method}-{index}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        out = cell_dir / "merged" / f"{method}-{index}"
        start = time.perf_counter()
        code = hf_dpmerge(["merge", str(path), str(out), "--overwrite", "--quiet", "--random-seed", str(cell.seed),
                           "--lora-merge-cache", str(cell_dir / "lora_cache"),
                           *(["--cuda"] if torch.cuda.is_available() else [])])
        seconds["merge"] += time.perf_counter() - start
        if code != 0:
            raise RuntimeError(f"hf-dpmerge merge {path} failed with exit status {code}")
        ctx.log(f"  {method} [{point_label(point)}] merged")
        return out

    def score(directory: Path, split: str):
        start = time.perf_counter()
        correct = scorer.merged(directory, split)
        seconds["scoring"] += time.perf_counter() - start
        return correct

    def discard(directory: Path) -> None:
        if not ctx.keep_models:
            shutil.rmtree(directory, ignore_errors=True)

    result = tune(list(SPACES[method]), merge, score, discard)
    ctx.ran += 1
    gc.collect()
    ctx.store.save(cell, f"tune_{method}", settings, {
        "trials": result["trials"], "selected": result["selected"], "point": result["point"],
        "test": accuracy(result["test"]), "correct": encode(result["test"]),
        "seconds": seconds, "host": _host(),
    })


def run_stress_cell(ctx: Context, cell: Cell) -> None:
    """Train (or perturb) the cell's adapters, score them, then tune and score every merge method."""
    for task in ctx.grid.tasks:
        if cell.noise_std is None:
            train_unit(ctx, cell, task)
        else:
            noise_unit(ctx, cell, task)
    scorer = _scorer(ctx, cell)
    individual_unit(ctx, cell, scorer)
    if cell.merged:
        for method in ctx.grid.merges:
            tune_unit(ctx, cell, method, scorer)
    shutil.rmtree(ctx.runs_dir(cell).parent / "lora_cache", ignore_errors=True)
