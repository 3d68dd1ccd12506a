"""Choose merge hyper-parameters on private validation data with a differentially private selection.

Every grid candidate is merged with mergekit and scored by its validation accuracy (each task's head on the
merged encoder, averaged over the T tasks); an ε-DP mechanism chooses one, kept at OUTPUT with its
mergekit_config.yml and dp_selection.json (ε_sel composed with the adapters' records). Scores are never printed or
saved. Public settings, fixed before the data is read: --validation_size n per task (each set subsampled to n,
Δ = 1/(T·n)); --rows_per_unit m for a user-level adapter (at most m rows of each unit scored, Δ = m/(T·n) per
unit); --composition sequential (ε_total = max_t ε_t + ε_sel) or, only when the validation people are disjoint
from the training people, parallel (max(max_t ε_t, ε_sel)). See docs/design.md §13. Example::

    hf-dpmerge tune merge_configs/task_arithmetic.yaml merged/tuned --grid lambda=0.3,0.5,0.7,1.0 \\
        --epsilon 1 --runs runs --tasks rotten_tomatoes,election_tweets --lora-merge-cache runs/lora_cache
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hf_dpmerge.cli.runs_options import add_private_selection_options

    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("config", help="base mergekit YAML configuration (the grid values are substituted into it)")
    parser.add_argument("output", help="directory for the chosen merged model (must not exist or be empty)")
    parser.add_argument("--grid", action="append", required=True, metavar="[I.]NAME=V1,V2,...",
                        help="candidate values of a top-level parameter (lambda=0.3,0.6) or of model I's "
                        "(1.weight=0.5,1.0); repeat for a Cartesian product")
    parser.add_argument("--epsilon", type=float, required=True, help="ε_sel spent by the selection (pure ε-DP)")
    add_private_selection_options(parser)


def run(args: argparse.Namespace) -> int:
    from hf_dpmerge.analysis.task_run import task_runs
    from hf_dpmerge.cli.runs_options import check_positive, parse_tasks
    from hf_dpmerge.merging.config_edit import read_merge_config
    from hf_dpmerge.records.run_folders import BASE_DIR
    from hf_dpmerge.scripts.tune import GridAxis, parse_validation_size, tune_merge

    check_positive(args, "epsilon", "batch_size", "rows_per_unit")
    config = read_merge_config(args.config)
    grid = [GridAxis.parse(text) for text in args.grid]
    runs = task_runs(args.runs, parse_tasks(args.tasks))
    record = tune_merge(
        config, grid, runs, args.output, epsilon=args.epsilon, mechanism=args.mechanism,
        composition=args.composition, validation_size=parse_validation_size(args.validation_size),
        rows_per_unit=args.rows_per_unit, base_dir=Path(args.base) if args.base else Path(args.runs) / BASE_DIR,
        lora_merge_cache=args.lora_merge_cache, batch_size=args.batch_size, device=args.device,
        log=lambda line: print(line, file=sys.stderr),
    )
    print(f"chosen: {record.candidates[record.chosen]} (candidate {record.chosen + 1} of {len(record.candidates)}, "
          f"{record.mechanism} mechanism, ε_sel = {record.epsilon:g}, Δ = {record.sensitivity:.3g})")
    print(f"total guarantee ({record.composition} composition with the adapters): "
          f"ε = {record.total_epsilon:.4g}, δ = {record.total_delta:.3g}")
    print(f"wrote {args.output} (merged model, mergekit_config.yml, dp_selection.json)")
    return 0
