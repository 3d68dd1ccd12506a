"""Choose merge hyper-parameters on private validation data with a differentially private selection.

Every candidate of the grid is merged with mergekit and scored by its validation accuracy (each task's
head on the merged encoder, averaged over tasks); one candidate is chosen by an ε-DP mechanism and kept at
OUTPUT with its mergekit_config.yml and dp_selection.json (the selection's ε_sel composed with the
adapters' records; ``hf-dpmerge push`` states the total on the card). Scores are never printed or saved.

Example::

    hf-dpmerge tune merge_configs/task_arithmetic.yaml merged/tuned --grid lambda=0.3,0.5,0.7,1.0 \\
        --epsilon 1 --runs runs --tasks rotten_tomatoes,election_tweets --lora-merge-cache runs/lora_cache

Validation size (``--validation_size``): a PUBLIC number n of validation examples per task (default 500;
``N`` for every task or ``TASK=N,TASK=N``), stated before looking at the data. Each task's validation set is
subsampled uniformly at random to n examples (a smaller set scores its missing examples as wrong), so
Δ = 1/(T·n) and the selection is ε_sel-DP under the addition, removal or replacement of one example; the
private set sizes are neither used in Δ nor written anywhere. A larger n uses more of each set.

User-level adapters (trained with ``--privacy_unit_column``, e.g. ``movie``): the selection is made per the same
unit. That task's validation split must hold the column (else refused); at most m of each unit's rows are scored
(``--rows_per_unit M``, public, default 1), then n of those, so Δ = m/(T·n) under the addition, removal or
replacement of one whole unit. A unit's rows beyond m are never scored: raise m when units have many rows and
there are few units, at the price of a larger Δ.

Composition (``--composition``): ``sequential`` (default; the validation data may belong to the people the
adapters were trained on): ε_total = max_t ε_t + ε_sel. ``parallel`` only when the validation people are
disjoint from the training people: ε_total = max(max_t ε_t, ε_sel); the record and card say which.
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
    from hf_dpmerge.analysis.runs_layout import task_runs
    from hf_dpmerge.cli.runs_options import check_positive, parse_tasks
    from hf_dpmerge.merging.config_edit import read_merge_config
    from hf_dpmerge.records.runs_layout import BASE_DIR
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
