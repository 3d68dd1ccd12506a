"""Evaluate each task's adapter and the merged model (with that task's own head) on the task's test split.

Prints and saves (``<output>/results.json``, ``<output>/retention.png``) per task the floor, the individual and
merged scores, gain retained = (merged − floor) / (individual − floor), retention = merged / individual,
interference = individual − merged and the adapter's ε, plus averages (docs/design.md §11). ``--merged`` must be a
merge of the runs scored, or nothing is scored (docs/bad-inputs.md). Causal-LM runs are scored by verbaliser
log-likelihood, the zero-shot base as the floor. Example::

    hf-dpmerge evaluate --runs runs --merged merged --tasks rotten_tomatoes,bbc_news --output runs/eval
    hf-dpmerge evaluate --max_eval_samples 200        # a quick look on a stratified subset of each test split
"""

from __future__ import annotations

import argparse
import sys

from hf_dpmerge.cli.runs_options import add_runs_options, check_positive, load_tokenizer, parse_tasks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_runs_options(parser)
    parser.add_argument("--output", help="where results.json and retention.png go (default: <runs>/eval)")
    parser.add_argument("--max_eval_samples", type=int, help="evaluate a seeded stratified subset of this size")
    parser.add_argument("--split", default="test", choices=("validation", "test"),
                        help="split to score (default: test; validation for choices made before the test split)")
    parser.add_argument("--floor_runs", help="runs folder of head-only releases (train_glue.py --train_lora false, "
                        "same tasks, same ε): the floor is then each task's private head, and the adapter's own head "
                        "on the base encoder is shown as 'own head'")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hf_dpmerge.analysis.causal_evaluation import is_causal_lm_dir
    from hf_dpmerge.analysis.evaluation import evaluate_runs

    tasks = parse_tasks(args.tasks)
    check_positive(args, "max_eval_samples", "max_length", "batch_size")
    if is_causal_lm_dir(Path(args.base) if args.base else Path(args.runs) / "base"):
        return run_causal(args, tasks)
    report = evaluate_runs(
        args.runs, args.merged, tasks, base_dir=args.base, tokenizer=load_tokenizer(args.tokenizer),
        max_eval_samples=args.max_eval_samples, max_length=args.max_length, data_seed=args.data_seed,
        batch_size=args.batch_size, glue_path=args.glue_path, device=args.device, split=args.split,
        floor_runs=args.floor_runs, log=lambda line: print(line, file=sys.stderr),
    )
    print(report.table())
    json_path, chart_path = report.save(Path(args.output) if args.output else Path(args.runs) / "eval")
    print(f"\nsaved {json_path} and {chart_path}")
    return 0


def run_causal(args: argparse.Namespace, tasks: list[str] | None) -> int:
    """Causal-LM runs (``examples/train_causal_lm.py``): zero-shot floor, individual and merged, scored by
    verbaliser log-likelihood, with retention and gain retained = (merged − floor)/(individual − floor)."""
    from pathlib import Path

    from hf_dpmerge.analysis.causal_evaluation import evaluate_causal_runs

    if args.tokenizer or args.glue_path:
        raise ValueError("--tokenizer/--glue_path: causal-LM runs are scored with their base's tokenizer on the "
                         "packaged tasks; drop the flag")
    report = evaluate_causal_runs(
        args.runs, args.merged, tasks, base_dir=args.base, max_eval_samples=args.max_eval_samples,
        split=args.split, max_length=args.max_length, data_seed=args.data_seed, batch_size=args.batch_size,
        device=args.device, log=lambda line: print(line, file=sys.stderr),
    )
    print(report.table())
    path = report.save(Path(args.output) if args.output else Path(args.runs) / "eval")
    print(f"\nsaved {path}")
    return 0
