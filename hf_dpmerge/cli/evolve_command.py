"""Search per-model (optionally per-layer) merge weights with CMA-ES on private validation data, every
generation's choice made by an ε-DP mechanism.

Each generation CMA-ES proposes --population weight vectors, each merged with mergekit and scored like a
``hf-dpmerge tune`` candidate; the exponential mechanism at ε_sel / --generations picks one and CMA-ES learns only
that choice, so the search is ε_sel-DP (basic composition). The last choice is kept at OUTPUT with its
dp_selection.json; scores are never printed or saved. --validation_size, --rows_per_unit and --composition are
tune's (``hf-dpmerge tune --help``; docs/design.md §13). Needs ``pip install 'hf_dpmerge[evolve]'``. Example::

    hf-dpmerge evolve merge_configs/task_arithmetic.yaml merged/evolved --epsilon 1 --generations 3 \\
        --population 4 --runs runs --lora-merge-cache runs/lora_cache
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hf_dpmerge.cli.runs_options import add_private_selection_options

    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("config", help="base mergekit YAML configuration (its models' weights are searched)")
    parser.add_argument("output", help="directory for the chosen merged model (must not exist or be empty)")
    parser.add_argument("--epsilon", type=float, required=True, help="ε_sel of the whole search (pure ε-DP), "
                        "split evenly over the generations")
    parser.add_argument("--generations", type=int, default=3, help="G, generations (default: 3)")
    parser.add_argument("--population", type=int, default=4, help="P, proposals per generation (default: 4)")
    parser.add_argument("--layer_points", type=int, default=1, help="weights per model: 1 (default) or K ≥ 2 "
                        "interpolated over the layers (a mergekit gradient)")
    parser.add_argument("--low", type=float, default=0.0, help="smallest weight searched (default: 0)")
    parser.add_argument("--high", type=float, default=2.0, help="largest weight searched (default: 2)")
    parser.add_argument("--step", type=float, default=0.3, help="CMA-ES's initial step size σ₀ (default: 0.3)")
    parser.add_argument("--seed", type=int, help="seed of the search, the subsamples and the mechanism (default: "
                        "fresh entropy). Whoever knows a fixed seed can undo the selection's noise: dp_selection.json "
                        "then says seeded and hf-dpmerge push refuses it unless --allow-seeded (tests, benchmarks)")
    add_private_selection_options(parser)


def run(args: argparse.Namespace) -> int:
    from hf_dpmerge.analysis.task_run import task_runs
    from hf_dpmerge.cli.runs_options import check_positive, parse_tasks
    from hf_dpmerge.merging.config_edit import read_merge_config
    from hf_dpmerge.records.run_folders import BASE_DIR
    from hf_dpmerge.scripts.evolve import evolve_merge
    from hf_dpmerge.scripts.tune import parse_validation_size

    if importlib.util.find_spec("cma") is None:
        raise ValueError("hf-dpmerge evolve needs the cma package: pip install 'hf_dpmerge[evolve]'")
    check_positive(args, "epsilon", "batch_size", "rows_per_unit", "step")
    record = evolve_merge(
        read_merge_config(args.config), task_runs(args.runs, parse_tasks(args.tasks)), args.output,
        epsilon=args.epsilon, generations=args.generations, population=args.population, mechanism=args.mechanism,
        composition=args.composition, base_dir=Path(args.base) if args.base else Path(args.runs) / BASE_DIR,
        layer_points=args.layer_points, low=args.low, high=args.high, step=args.step,
        validation_size=parse_validation_size(args.validation_size), rows_per_unit=args.rows_per_unit,
        lora_merge_cache=args.lora_merge_cache, batch_size=args.batch_size, device=args.device, seed=args.seed,
        log=lambda line: print(line, file=sys.stderr),
    )
    weights = ", ".join(f"{w:.3g}" for w in record.candidates[record.chosen]["weights"])
    print(f"chosen: weights [{weights}] (generation {record.extra['generations']}'s choice, {record.mechanism} "
          f"mechanism at ε = {record.extra['epsilon_per_generation']:.3g} per generation, ε_sel = {record.epsilon:g})")
    print(f"total guarantee ({record.composition} composition with the adapters): "
          f"ε = {record.total_epsilon:.4g}, δ = {record.total_delta:.3g}")
    print(f"wrote {args.output} (merged model, mergekit_config.yml, dp_selection.json)")
    return 0
