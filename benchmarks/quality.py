"""Quality benchmark: private adapters, their merges and their geometry on real packaged tasks → BENCHMARKS.md.

For every training cell (trainer × ε × seed) it trains one LoRA adapter per task through the code path of
``examples/train_glue.py`` (its ``train_task`` from one shared base; ``DP_DEFAULTS`` + the grid's flags + the
trainer's flags), measures each adapter's sharpness, top Hessian eigenvalue and drift on a validation subset
(:func:`hf_dpmerge.analysis.diagnostics.diagnose_runs`), then merges the cell's adapters with every merge method
(configs generated from ``merge_configs/*.yaml``, merged by ``hf-dpmerge merge``, i.e. ``mergekit-yaml``),
scores individual, merged and normalised accuracy on the test split (:func:`hf_dpmerge.analysis.evaluation.
evaluate_runs`) and the merge gap and interpolation curve on the validation subset.

Each finished unit (one task's training, one cell's merge) writes a JSON under ``<work-dir>/results``; a rerun
skips every unit whose JSON exists with the same settings, so an interrupted run resumes. The report
(``BENCHMARKS.md`` and ``benchmarks/plots/*.png`` under ``--report-dir``) is generated from those JSONs only.

    python benchmarks/quality.py --grid cpu --plan     # list the runs and estimate their time; train nothing
    python benchmarks/quality.py --grid cpu            # reduced grid for 2 CPU cores (see --plan)
    python benchmarks/quality.py --grid full           # the full grid, for a GPU
    python benchmarks/quality.py --grid smoke --work-dir /tmp/quality-smoke   # minutes: it runs and resumes
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))
sys.path.insert(0, str(REPO / "benchmarks"))

import train_glue  # noqa: E402  (DP_DEFAULTS, ScriptArguments, shared_base, train_task: the example's code path)

# flags appended after DP_DEFAULTS and the grid's flags (later flags win); ρ, λ, lr, C stay DP_DEFAULTS' / DPSAMConfig's
TRAINERS: dict[str, list[str]] = {
    "non_private": ["--dp", "false", "--sam_mode", "none", "--align_lambda", "0"],
    "dp_sgd": ["--sam_mode", "none", "--align_lambda", "0"],
    "dp_merging": ["--sam_mode", "dp_sat"],  # DP-SAT ascent + alignment penalty at DPSAMConfig's λ
    "two_query": ["--sam_mode", "two_query"],  # the paper's two privatised queries, accounted at σ/√2
}
MERGE_CONFIGS = {"task_arithmetic": "task_arithmetic.yaml", "ties": "ties.yaml", "cauchy_poe": "cauchy_poe.yaml",
                 "dp_aware": "dp.yaml"}
HEADLINE_EPSILON = 4.0
SHARPNESS_RHO = 0.05  # the measuring radius of Sharp_t, the same for every trainer (the paper's ρ)
DIAGNOSTIC_SPLIT = "validation"

# Time model of --plan, for MiniLM on 2 idle CPU cores. Throughput: ASSETS.md (fwd+bwd); per-sample gradients
# cost 1.5–2× a plain step (1.75 taken), two_query makes two such queries; a forward pass ≈ 1/3 of fwd+bwd; a
# Hessian-vector product (double backward) ≈ 3 fwd+bwd. Fixed costs per training run (data, tokenisation, model,
# σ calibration), per merge (mergekit, MiniLM: 2.4–5 s measured on the loaded smoke run), per data and model load.
TOKENS_PER_SECOND = 3400.0
TRAINER_COST = {"non_private": 1.0, "dp_sgd": 1.75, "dp_merging": 1.75, "two_query": 3.5}
FORWARD_COST, HVP_COST = 1 / 3, 3.0
RUN_OVERHEAD_S, MERGE_S, DATA_LOAD_S, MODEL_LOAD_S = 20.0, 10.0, 2.0, 1.5


@dataclass(frozen=True)
class Grid:
    """What one ``--grid`` runs. ``seeds`` apply to the headline cells (ε = 4 and non-private) and, with
    ``seed_every_epsilon``, to every cell; other cells run the first seed only."""

    tasks: tuple[str, ...]
    trainers: tuple[str, ...]
    epsilons: tuple[float, ...]
    merges: tuple[str, ...]
    seeds: int
    seed_every_epsilon: bool
    train_flags: tuple[str, ...]
    max_eval_samples: int | None
    diagnostic_samples: int
    hessian_iterations: int
    gammas: tuple[float, ...]
    reductions: str


TASKS = ("rotten_tomatoes", "election_tweets", "reuters_r8", "bbc_news")
GRIDS: dict[str, Grid] = {
    "full": Grid(
        tasks=TASKS, trainers=tuple(TRAINERS), epsilons=(1.0, 4.0, 8.0), merges=tuple(MERGE_CONFIGS), seeds=3,
        seed_every_epsilon=True, train_flags=(), max_eval_samples=None, diagnostic_samples=512,
        hessian_iterations=20, gammas=tuple(i / 10 for i in range(11)),
        reductions="none: DP_DEFAULTS as they are, full test splits, 3 seeds in every cell",
    ),
    "cpu": Grid(
        tasks=TASKS, trainers=("non_private", "dp_sgd", "dp_merging"), epsilons=(4.0, 8.0), merges=tuple(MERGE_CONFIGS),
        seeds=1, seed_every_epsilon=False,
        train_flags=("--per_device_train_batch_size", "256", "--max_steps", "30", "--max_length", "32"),
        max_eval_samples=1000, diagnostic_samples=128, hessian_iterations=6, gammas=(0.0, 0.25, 0.5, 0.75, 1.0),
        reductions="no two_query trainer; ε ∈ {4, 8} (no ε = 1); 1 seed (no ± std); expected batch 256 and 30 steps "
                   "instead of DP_DEFAULTS'; inputs truncated to 32 tokens; test subsets of ≤ 1000 examples per task; "
                   "diagnostics on 128 validation examples, 6 power-iteration steps, 5 interpolation points",
    ),
    "smoke": Grid(
        tasks=("rotten_tomatoes", "bbc_news"), trainers=tuple(TRAINERS), epsilons=(HEADLINE_EPSILON,),
        merges=tuple(MERGE_CONFIGS), seeds=1, seed_every_epsilon=False,
        train_flags=("--per_device_train_batch_size", "16", "--physical_batch_size", "16", "--max_steps", "3",
                     "--max_length", "32", "--max_train_samples", "200"),
        max_eval_samples=48, diagnostic_samples=24, hessian_iterations=2, gammas=(0.0, 0.5, 1.0),
        reductions="a smoke test, not a benchmark: 2 tasks, 3 steps of 16 examples from 200, 48 test examples",
    ),
}


@dataclass(frozen=True)
class Cell:
    """One set of adapters: a trainer at a privacy level (None: non-private) and a seed."""

    trainer: str
    epsilon: float | None
    seed: int

    @property
    def name(self) -> str:
        level = "" if self.epsilon is None else f"-eps{self.epsilon:g}"
        return f"{self.trainer}{level}-seed{self.seed}"


def plan_cells(grid: Grid, seeds: int) -> list[Cell]:
    """The grid's cells, headline ones first (first seed, ε = 4), so a partial run already answers most."""
    cells = []
    for trainer in grid.trainers:
        levels = [None] if trainer == "non_private" else list(grid.epsilons)
        for epsilon in levels:
            headline = epsilon is None or epsilon == HEADLINE_EPSILON
            for seed in range(seeds if headline or grid.seed_every_epsilon else 1):
                cells.append(Cell(trainer, epsilon, seed))
    priority = {HEADLINE_EPSILON: 0, 8.0: 1}
    return sorted(cells, key=lambda c: (c.seed, priority.get(c.epsilon, 0 if c.epsilon is None else 2),
                                        grid.trainers.index(c.trainer), c.epsilon or 0))


# ---------------------------------------------------------------------------------------------- results store


class Store:
    """One JSON per finished unit under ``<work-dir>/results/<cell>/``; a unit is done when its settings match."""

    def __init__(self, work_dir: Path):
        self.root = work_dir / "results"

    def path(self, cell: Cell, unit: str) -> Path:
        return self.root / cell.name / f"{unit}.json"

    def load(self, cell: Cell, unit: str, settings: dict[str, Any]) -> dict[str, Any] | None:
        """The unit's result, or None when it is missing or was made with other settings."""
        path = self.path(cell, unit)
        if not path.is_file():
            return None
        result = json.loads(path.read_text())
        return result if result["settings"] == _jsonable(settings) else None

    def save(self, cell: Cell, unit: str, settings: dict[str, Any], payload: dict[str, Any]) -> None:
        """Write the unit's result atomically (temporary file, then rename)."""
        result = {"settings": _jsonable(settings), **payload}
        path = self.path(cell, unit)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(result, indent=1, allow_nan=True) + "\n")
        temporary.replace(path)


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, allow_nan=True))


# ---------------------------------------------------------------------------------------------- units


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
    """The full train_glue.py command line of a cell (DP_DEFAULTS first; later flags win)."""
    argv = [*train_glue.DP_DEFAULTS, *ctx.grid.train_flags, *TRAINERS[cell.trainer],
            "--seed", str(cell.seed), "--dp_seed", str(cell.seed), "--disable_tqdm", "true",
            "--runs_dir", str(ctx.runs_dir(cell)), "--overwrite", "true"]  # a unit reruns only when stale
    if cell.epsilon is not None:
        argv += ["--target_epsilon", f"{cell.epsilon:g}"]
    if ctx.grid.max_eval_samples is not None:
        argv += ["--max_eval_samples", str(ctx.grid.max_eval_samples)]
    if ctx.model:
        argv += ["--model_name_or_path", ctx.model]
    return argv


def parse_train_arguments(argv: list[str]):
    from transformers import HfArgumentParser

    from hf_dpmerge import DPSAMConfig

    return HfArgumentParser((train_glue.ScriptArguments, DPSAMConfig)).parse_args_into_dataclasses(args=argv)


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


def pending(ctx: Context, cell: Cell, unit: str) -> dict[str, Any] | None:
    """The unit's settings when it still has to run; None (counted as skipped) when it is done."""
    settings = unit_settings(ctx, cell, unit)
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
    script, config = parse_train_arguments(settings["argv"])
    script = train_glue.resolve_pooling(script)  # as train_glue.main() does
    base_dir = train_glue.shared_base(dataclasses.replace(script, runs_dir=str(ctx.work_dir)))
    set_seed(cell.seed)  # LoRA and head initialisation do not depend on what ran before in this process
    start = time.perf_counter()
    summary = train_glue.train_task(task, script, config, base_dir)
    trained = time.perf_counter()
    report = diagnose_runs(ctx.runs_dir(cell), None, [task], split=DIAGNOSTIC_SPLIT,
                           max_samples=ctx.grid.diagnostic_samples, rho=SHARPNESS_RHO,
                           hessian_iterations=ctx.grid.hessian_iterations, base_dir=base_dir, log=ctx.log)
    seconds = {"train": trained - start, "diagnostics": time.perf_counter() - trained}
    ctx.ran += 1
    gc.collect()
    ctx.store.save(cell, f"train_{task}", settings, {
        "summary": summary, "diagnostics": report.tasks[0].to_dict(), "hyperparameters": training_summary(script, config),
        "seconds": seconds, "host": _host(),
    })


def merge_config(merge: str, base_dir: Path, adapters: list[Path], non_private: bool = False) -> dict[str, Any]:
    """``merge_configs/<method>.yaml`` with its base and inputs replaced by this cell's (parameters kept); for
    non-private adapters, ``dp_aware`` is told so (``allow_non_private: true``), as it requires."""
    import yaml

    template = yaml.safe_load((REPO / "merge_configs" / MERGE_CONFIGS[merge]).read_text())
    if template["merge_method"] != merge:
        raise ValueError(f"merge_configs/{MERGE_CONFIGS[merge]} merges with {template['merge_method']}, not {merge}")
    if non_private and merge == "dp_aware":
        template["parameters"] = {**(template.get("parameters") or {}), "allow_non_private": True}
    return {**template, "base_model": str(base_dir), "models": [{"model": f"{base_dir}+{a}"} for a in adapters]}


def merge_unit(ctx: Context, cell: Cell, merge: str) -> None:
    """Merge a cell's adapters with one method, then score and diagnose the merge (skipped when done)."""
    import torch
    import yaml

    from hf_dpmerge.analysis.diagnostics import diagnose_runs
    from hf_dpmerge.analysis.evaluation import evaluate_runs
    from hf_dpmerge.cli.main import main as hf_dpmerge

    runs_dir, tasks = ctx.runs_dir(cell), list(ctx.grid.tasks)
    settings = pending(ctx, cell, f"merge_{merge}")
    if settings is None:
        return
    cell_dir = runs_dir.parent
    config_path = cell_dir / f"{merge}.yaml"
    config_path.write_text(yaml.safe_dump(settings["merge"], sort_keys=False))
    merged = cell_dir / "merged" / merge
    start = time.perf_counter()
    code = hf_dpmerge(["merge", str(config_path), str(merged), "--overwrite", "--quiet",
                       "--lora-merge-cache", str(cell_dir / "lora_cache"),
                       *(["--cuda"] if torch.cuda.is_available() else [])])
    if code != 0:
        raise RuntimeError(f"hf-dpmerge merge {config_path} failed with exit status {code}")
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


# ---------------------------------------------------------------------------------------------- time estimate


def _task_token_counts(ctx: Context, task: str, script) -> dict[str, Any]:
    """Token lengths of the training split, and total tokens of the test and diagnostic subsets."""
    from transformers import AutoTokenizer

    from hf_dpmerge.data import default_model_path, load_task, tokenize_task

    tokenizer = AutoTokenizer.from_pretrained(ctx.model or default_model_path())
    splits, spec = load_task(task, max_train_samples=script.max_train_samples,
                             max_eval_samples=ctx.grid.max_eval_samples)
    lengths = {split: np.array([len(ids) for ids in data["input_ids"]])
               for split, data in tokenize_task(splits, spec, tokenizer, script.max_length).items()}
    diagnostic = np.mean(lengths["validation"]) * min(ctx.grid.diagnostic_samples, len(lengths["validation"]))
    return {"train_lengths": lengths["train"], "test_tokens": float(lengths["test"].sum()),
            "diagnostic_tokens": float(diagnostic)}


def estimate_seconds(ctx: Context, cells: list[Cell]) -> dict[str, float]:
    """Seconds per part of the grid on 2 idle CPU cores, from token counts and the time model above.

    A training step costs B_exp × (mean longest row of a B_exp-row draw: padding is per draw) tokens × the
    trainer's cost; the power iteration is counted at its cap of Hessian-vector products.
    """
    rng = np.random.default_rng(0)
    parsed = {cell: parse_train_arguments(train_arguments(ctx, cell)) for cell in cells}
    counts = {task: _task_token_counts(ctx, task, parsed[cells[0]][0]) for task in ctx.grid.tasks}
    parts = dict.fromkeys(("training", "adapter diagnostics", "merging", "evaluation", "interpolation"), 0.0)
    seconds = 1 / TOKENS_PER_SECOND
    for cell in cells:
        batch, steps = parsed[cell][1].per_device_train_batch_size, parsed[cell][1].max_steps
        for count in counts.values():
            lengths = count["train_lengths"]
            padded = np.mean([lengths[rng.integers(0, len(lengths), batch)].max() for _ in range(200)])
            parts["training"] += (RUN_OVERHEAD_S + steps * batch * padded * TRAINER_COST[cell.trainer] * seconds
                                  + count["test_tokens"] * FORWARD_COST * seconds)
            parts["adapter diagnostics"] += DATA_LOAD_S + MODEL_LOAD_S + count["diagnostic_tokens"] * seconds * (
                1 + FORWARD_COST + ctx.grid.hessian_iterations * HVP_COST)
        for _ in ctx.grid.merges:
            parts["merging"] += MERGE_S
            for count in counts.values():  # individual and merged model on the test subset
                parts["evaluation"] += DATA_LOAD_S + 2 * (MODEL_LOAD_S + count["test_tokens"] * FORWARD_COST * seconds)
                parts["interpolation"] += DATA_LOAD_S + 2 * MODEL_LOAD_S + len(ctx.grid.gammas) * (
                    count["diagnostic_tokens"] * FORWARD_COST * seconds)
    return parts


# ---------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", choices=sorted(GRIDS), default="cpu", help="which grid to run (default: cpu)")
    parser.add_argument("--work-dir", type=Path, help="where adapters and results go (default: runs/quality/<grid>)")
    parser.add_argument("--report-dir", type=Path, help="where BENCHMARKS.md and benchmarks/plots/ go "
                        "(default: the repository for cpu/full, the work dir for smoke)")
    parser.add_argument("--seeds", type=int, help="seeds of the headline cells (default: the grid's)")
    parser.add_argument("--tasks", help="comma-separated subset or replacement of the grid's tasks")
    parser.add_argument("--trainers", help=f"comma-separated subset of {','.join(TRAINERS)}")
    parser.add_argument("--epsilons", help="comma-separated ε values (default: the grid's)")
    parser.add_argument("--merges", help=f"comma-separated subset of {','.join(MERGE_CONFIGS)}")
    parser.add_argument("--model_name_or_path", help="base encoder (default: the packaged all-MiniLM-L6-v2)")
    parser.add_argument("--keep-models", action="store_true", help="keep merged models (default: delete each "
                        "after it is scored; adapters are always kept)")
    parser.add_argument("--plan", action="store_true", help="print the cells and the estimated time; run nothing")
    parser.add_argument("--report-only", action="store_true", help="regenerate the report from stored results")
    args = parser.parse_args(argv)

    grid = _customised(GRIDS[args.grid], args)
    seeds = args.seeds if args.seeds is not None else grid.seeds
    if seeds < 1:
        raise SystemExit("--seeds must be ≥ 1")
    work_dir = (args.work_dir or REPO / "runs" / "quality" / args.grid).resolve()
    report_dir = (args.report_dir or (work_dir if args.grid == "smoke" else REPO)).resolve()
    ctx = Context(grid, work_dir, Store(work_dir), args.model_name_or_path, args.keep_models,
                  log=lambda line: print(line, file=sys.stderr, flush=True))
    cells = plan_cells(grid, seeds)
    if args.plan:
        parts = estimate_seconds(ctx, cells)
        print(f"{len(cells)} cells × {len(grid.tasks)} tasks = {len(cells) * len(grid.tasks)} trainings, "
              f"{len(cells) * len(grid.merges)} merges")
        for cell in cells:
            print(f"  {cell.name}")
        for part, seconds in parts.items():
            print(f"{part:<20} {seconds / 60:6.1f} min")
        print(f"{'total':<20} {sum(parts.values()) / 60:6.1f} min (2 idle CPU cores, {TOKENS_PER_SECOND:.0f} tokens/s)")
        return 0
    if not args.report_only:
        for cell in cells:
            run_cell(ctx, cell)
        print(f"ran {ctx.ran} units, skipped {ctx.skipped} finished ones")
    from quality_report import write_report

    given = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "benchmarks/quality.py", *(a for a in given if a != "--report-only")])
    path = write_report(ctx.store, grid, cells, lambda cell, unit: unit_settings(ctx, cell, unit), report_dir,
                        command, train_glue.DP_DEFAULTS, TRAINERS)
    print(f"report written to {path}")
    return 0


def _customised(grid: Grid, args: argparse.Namespace) -> Grid:
    """The grid with the command line's --tasks / --trainers / --epsilons / --merges applied (checked)."""
    from hf_dpmerge.data import get_task_spec

    def names(text: str | None, known: dict | None, default: tuple) -> tuple:
        if not text:
            return default
        chosen = tuple(t.strip() for t in text.split(",") if t.strip())
        unknown = [t for t in chosen if known is not None and t not in known]
        if unknown or not chosen or len(set(chosen)) != len(chosen):
            raise SystemExit(f"bad choice {text!r}; known: {', '.join(known or [])}")
        return chosen

    tasks = names(args.tasks, None, grid.tasks)
    for task in tasks:
        get_task_spec(task)
    try:
        epsilons = tuple(float(e) for e in names(args.epsilons, None, tuple(map(str, grid.epsilons))))
    except ValueError:
        raise SystemExit(f"--epsilons takes comma-separated numbers, got {args.epsilons!r}") from None
    if any(not (e > 0 and np.isfinite(e)) for e in epsilons):
        raise SystemExit("--epsilons must be finite and positive")
    return dataclasses.replace(grid, tasks=tasks, epsilons=epsilons,
                               trainers=names(args.trainers, TRAINERS, grid.trainers),
                               merges=names(args.merges, MERGE_CONFIGS, grid.merges))


if __name__ == "__main__":
    sys.exit(main())
