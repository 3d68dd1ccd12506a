"""Fit a fresh linear probe for each task on the base encoder's and the merged encoder's features.

A skill removal (task negation, ``safe_merge``) is judged without the released head: a new logistic-regression
probe is fitted on half of each task's --split (validation by default) and scored on the other half, once on the
base encoder's pooled features and once on the merged encoder's. The task to remove should read lower on the
merged encoder; a control task shows what the edit costs the rest. The scores are computed on that split's data
and are not covered by any release's guarantee.

Example::

    hf-dpmerge probe --runs runs --merged merged/away --tasks election_tweets,bbc_news --max_samples 500
"""

from __future__ import annotations

import argparse
import json
import sys

from hf_dpmerge.cli.runs_options import add_runs_options, check_positive, load_tokenizer, parse_tasks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_runs_options(parser)
    parser.add_argument("--split", default="validation", choices=("validation", "test"),
                        help="split whose halves fit and score the probe (default: validation)")
    parser.add_argument("--max_samples", type=int, help="a seeded stratified subset of the split of this size")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fit / held-out halves (default: 0)")
    parser.add_argument("--l2", type=float, default=1e-3, help="L2 penalty on the probe's weights (default: 1e-3)")
    parser.add_argument("--json", help="also write the results to this JSON file")


def run(args: argparse.Namespace) -> int:
    from hf_dpmerge.analysis.probe import probe_json, probe_runs, probe_table

    check_positive(args, "max_samples", "max_length", "batch_size")
    if not args.l2 >= 0:
        raise ValueError(f"--l2 must be ≥ 0, got {args.l2}")
    results = probe_runs(
        args.runs, args.merged, parse_tasks(args.tasks), split=args.split, max_samples=args.max_samples,
        seed=args.seed, l2=args.l2, base_dir=args.base, tokenizer=load_tokenizer(args.tokenizer),
        max_length=args.max_length, data_seed=args.data_seed, glue_path=args.glue_path, batch_size=args.batch_size,
        device=args.device, log=lambda line: print(line, file=sys.stderr),
    )
    print(probe_table(results))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(probe_json(results), handle, indent=2)
            handle.write("\n")
        print(f"\nsaved {args.json}")
    return 0
