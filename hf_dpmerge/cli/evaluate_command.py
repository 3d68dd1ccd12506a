"""Evaluate each task's adapter and the merged model (with that task's own head) on the task's test split.

Prints and saves (``<output>/results.json``, ``<output>/retention.png``) per task: the individual score,
the merged score, retention = merged / individual, interference = individual − merged, and the adapter's
ε (∞ when non-private); plus averages over tasks.

Example::

    hf-dpmerge evaluate --runs runs --merged merged --tasks rotten_tomatoes,bbc_news --output runs/eval
    hf-dpmerge evaluate --max_eval_samples 200        # a quick look on a stratified subset of each test split
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--runs", default="runs", help="training output folder with base/ and <task>/adapter/ "
                        "(default: runs)")
    parser.add_argument("--merged", default="merged", help="merged model directory written by mergekit-yaml "
                        "(default: merged)")
    parser.add_argument("--tasks", help="comma-separated run folders to evaluate (default: every <runs>/<task>/ "
                        "with adapter/dp_privacy.json)")
    parser.add_argument("--output", help="where results.json and retention.png go (default: <runs>/eval)")
    parser.add_argument("--base", help="base model directory (default: <runs>/base)")
    parser.add_argument("--tokenizer", help="tokenizer directory or Hub id (default: the adapter's, the "
                        "base's or the merged model's)")
    parser.add_argument("--max_eval_samples", type=int, help="evaluate a seeded stratified subset of this size")
    parser.add_argument("--max_length", type=int, help="truncate inputs to this many tokens (default: the "
                        "record's extra.max_length, else 128)")
    parser.add_argument("--data_seed", type=int, help="split seed (default: the record's extra.data_seed, "
                        "else 42); must match training's")
    parser.add_argument("--batch_size", type=int, default=32, help="evaluation batch size (default: 32)")
    parser.add_argument("--glue_path", help="GLUE dataset repository or local copy for GLUE tasks "
                        "(default: nyu-mll/glue)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hf_dpmerge.analysis.evaluation import evaluate_runs

    tasks = None
    if args.tasks:
        tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
        if not tasks or len(set(tasks)) != len(tasks):
            raise ValueError(f"--tasks must name distinct tasks, got {args.tasks!r}")
    for name in ("max_eval_samples", "max_length", "batch_size"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise ValueError(f"--{name} must be positive, got {value}")
    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    report = evaluate_runs(
        args.runs, args.merged, tasks, base_dir=args.base, tokenizer=tokenizer,
        max_eval_samples=args.max_eval_samples, max_length=args.max_length, data_seed=args.data_seed,
        batch_size=args.batch_size, glue_path=args.glue_path, log=lambda line: print(line, file=sys.stderr),
    )
    print(report.table())
    json_path, chart_path = report.save(Path(args.output) if args.output else Path(args.runs) / "eval")
    print(f"\nsaved {json_path} and {chart_path}")
    return 0
