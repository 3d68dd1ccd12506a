"""``python -m benchmarks.quality``: run a grid (or plan it), then write BENCHMARKS.md."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path

import numpy as np

from benchmarks.merging import MERGE_CONFIGS
from hf_dpmerge.training.recipe import DP_RECIPE

from . import __doc__ as DESCRIPTION
from .grid import CELL_ARGUMENTS, GRIDS, TRAINERS, Grid, is_headline, plan_cells
from .merge_space import BUDGET, SPACES
from .report import write_report
from .store import Store
from .stress_report import write_stress_report
from .stress_run import run_stress_cell, stress_settings
from .time_model import TOKENS_PER_SECOND, estimate_seconds, estimate_stress_seconds
from .units import REPO, Context, arguments_set_by, parse_train_arguments, run_cell, unit_settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quality", description=DESCRIPTION.splitlines()[0],
                                     epilog=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", choices=sorted(GRIDS), default="cpu", help="which grid to run (default: cpu; "
                        "stress: the stress benchmark on 2 CPU cores, stress-full: on a GPU)")
    parser.add_argument("--work-dir", type=Path, help="where adapters and results go (default: runs/quality/<grid>)")
    parser.add_argument("--report-dir", type=Path, help="where BENCHMARKS.md and benchmarks/plots/ go "
                        "(default: the repository for cpu/full, the work dir for smoke)")
    parser.add_argument("--seeds", type=int, help="seeds of the headline cells (default: the grid's)")
    parser.add_argument("--tasks", help="comma-separated subset or replacement of the grid's tasks")
    parser.add_argument("--trainers", help=f"comma-separated subset of {','.join(TRAINERS)}")
    parser.add_argument("--epsilons", help="comma-separated ε values (default: the grid's)")
    parser.add_argument("--merges", help=f"comma-separated merge methods: {','.join(MERGE_CONFIGS)} (stress grids: "
                        f"any of {','.join(SPACES)})")
    parser.add_argument("--model_name_or_path", help="base encoder (default: the packaged all-MiniLM-L6-v2)")
    parser.add_argument("--train-flags", help="train_glue.py flags appended to the grid's, as one quoted string "
                        "(later flags win), e.g. --train-flags=\"--max_steps 400 --learning_rate 5e-4\"; units "
                        "trained with other flags rerun")
    parser.add_argument("--keep-models", action="store_true", help="keep merged models (default: delete each "
                        "after it is scored; adapters are always kept)")
    parser.add_argument("--seed-test-subsets", action="store_true", help="stress grids: score each seed on its "
                        "own seeded stratified test subset (default: one fixed subset for every seed, as the stored "
                        "results were made); seeds then add distinct test examples")
    parser.add_argument("--plan", action="store_true", help="print the cells and the estimated time; run nothing")
    parser.add_argument("--report-only", action="store_true", help="regenerate the report from stored results")
    args = parser.parse_args(argv)

    grid = _customised(GRIDS[args.grid], args)
    seeds = args.seeds if args.seeds is not None else grid.seeds
    if seeds < 1:
        raise SystemExit("--seeds must be ≥ 1")
    work_dir = (args.work_dir or REPO / "runs" / "quality" / args.grid).resolve()
    report_dir = (args.report_dir or (work_dir if args.grid.endswith("smoke") else REPO)).resolve()
    ctx = Context(grid, work_dir, Store(work_dir), args.model_name_or_path, args.keep_models,
                  log=lambda line: print(line, file=sys.stderr, flush=True))
    cells = plan_cells(grid, seeds)
    if args.plan:
        (_plan_stress if grid.stress is not None else _plan)(ctx, cells)
        return 0
    run, write, settings = ((run_stress_cell, write_stress_report, stress_settings) if grid.stress is not None
                            else (run_cell, write_report, unit_settings))
    if not args.report_only:
        for cell in cells:
            run(ctx, cell)
        print(f"ran {ctx.ran} units, skipped {ctx.skipped} finished ones")
    path = write(ctx.store, grid, cells, lambda cell, unit: settings(ctx, cell, unit), report_dir, _command(argv),
                 DP_RECIPE, TRAINERS)
    print(f"report written to {path}")
    return 0


def _plan(ctx: Context, cells: list) -> None:
    """The cells and the estimated time of each part."""
    grid = ctx.grid
    parts = estimate_seconds(ctx, cells)
    print(f"{len(cells)} cells × {len(grid.tasks)} tasks = {len(cells) * len(grid.tasks)} trainings, "
          f"{len(cells) * len(grid.merges)} merges")
    for cell in cells:
        print(f"  {cell.name}")
    for part, seconds in parts.items():
        print(f"{part:<20} {seconds / 60:6.1f} min")
    print(f"{'total':<20} {sum(parts.values()) / 60:6.1f} min (2 idle CPU cores, {TOKENS_PER_SECOND:.0f} tokens/s)")


def _plan_stress(ctx: Context, cells: list) -> None:
    """A stress grid's cells and estimated time, the headline cells and the rest apart, and its reductions."""
    estimate = estimate_stress_seconds(ctx, cells)
    trained = [c for c in cells if c.noise_std is None]
    merged = [c for c in cells if c.merged]
    print(f"{len(cells)} cells ({len(cells) - len(trained)} noise-injection): {len(trained) * len(ctx.grid.tasks)} "
          f"trainings, {len(merged)} × {len(ctx.grid.merges)} tuned merges of {BUDGET} points each")
    for part, parts in estimate.items():
        print(f"{part} cells:")
        for cell in cells:
            if (part == "headline") == is_headline(ctx.grid, cell):
                print(f"  {cell.name}")
        for name, seconds in parts.items():
            print(f"  {name:<20} {seconds / 60:6.1f} min")
        print(f"  {'total':<20} {sum(parts.values()) / 60:6.1f} min")
    total = sum(sum(parts.values()) for parts in estimate.values())
    print(f"{'total':<22} {total / 60:6.1f} min (2 idle CPU cores, {TOKENS_PER_SECOND:.0f} tokens/s)")
    print(f"reductions: {ctx.grid.reductions}")


def _command(argv: list[str] | None) -> str:
    given = sys.argv[1:] if argv is None else argv
    return shlex.join(["python", "-m", "benchmarks.quality", *(a for a in given if a != "--report-only")])


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
    grid = dataclasses.replace(grid, tasks=tasks, epsilons=epsilons,
                               trainers=names(args.trainers, TRAINERS, grid.trainers),
                               merges=names(args.merges, SPACES if grid.stress else MERGE_CONFIGS, grid.merges))
    if args.seed_test_subsets:
        if grid.stress is None:
            raise SystemExit("--seed-test-subsets applies to the stress grids only (--grid stress, stress-full, "
                             "stress-smoke)")
        grid = dataclasses.replace(grid, stress=dataclasses.replace(grid.stress, seed_test_subsets=True))
    return _with_train_flags(grid, args.train_flags) if args.train_flags else grid


def _with_train_flags(grid: Grid, text: str) -> Grid:
    """``grid`` with ``--train-flags`` appended to its training flags, after checking that train_glue.py accepts
    them and that none is a flag the benchmark sets per cell (it would be overridden silently)."""
    extra = tuple(shlex.split(text))
    try:
        owned = sorted(arguments_set_by(list(extra)) & CELL_ARGUMENTS)
        if not owned:
            parse_train_arguments([*DP_RECIPE, *grid.train_flags, *extra])
    except ValueError as error:  # HfArgumentParser: unknown flags; the script: a refused combination
        raise SystemExit(f"--train-flags {text!r}: {error}") from None
    except SystemExit:  # argparse has printed which value it refused
        raise SystemExit(f"--train-flags {text!r}: train_glue.py refuses a value (see above)") from None
    if owned:
        raise SystemExit(f"--train-flags: {', '.join('--' + name for name in owned)} is set per cell by the "
                         "benchmark; choose it with --trainers, --epsilons, --seeds or --model_name_or_path")
    return dataclasses.replace(grid, train_flags=(*grid.train_flags, *extra),
                               reductions=f"{grid.reductions}; changed by --train-flags {shlex.join(extra)}")


if __name__ == "__main__":
    sys.exit(main())
