"""Geometry diagnostics of each task's adapter and of the merged model, on a split of each task's data.

Per task: sharpness Sharp = L(w + ρ∇L/‖∇L‖) − L(w) and the top Hessian eigenvalue over the adapter's
parameters, drift ‖ΔW‖_F/‖W_0‖_F per LoRA layer and in total, the merge gap L(w_merge) − L(w_task) and the
interpolation curve L((1−γ)w_task + γw_merge) (DP-Merging Figure 2). Saved as ``<output-dir>/diagnostics.json``
and ``<output-dir>/interpolation.png``.

Privacy: diagnostics computed on private data are NOT covered by the adapters' DP guarantee; do not release
them unless the data they were computed on may be disclosed.

Example::

    hf-dpmerge diagnose --runs runs --merged merged --split validation --max-samples 256 --output-dir runs/diagnostics
"""

from __future__ import annotations

import argparse
import sys

from hf_dpmerge.cli.runs_options import add_runs_options, check_positive, load_tokenizer, parse_tasks


def _gammas(text: str) -> list[float]:
    try:
        return [float(g) for g in text.split(",") if g.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gammas takes comma-separated numbers in [0, 1], got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_runs_options(parser)
    parser.add_argument("--split", default="validation", choices=("train", "validation", "test"),
                        help="data the diagnostics are computed on (default: validation)")
    parser.add_argument("--max-samples", "--max_samples", dest="max_samples", type=int,
                        help="use a seeded stratified subset of the split of this size (default: all of it)")
    parser.add_argument("--rho", type=float, default=0.05, help="sharpness ascent radius ρ (default: 0.05)")
    parser.add_argument("--gammas", type=_gammas,
                        help="interpolation coefficients in [0, 1], comma-separated; 0 and 1 are always "
                        "included (default: 0,0.1,...,1)")
    parser.add_argument("--hessian-iterations", "--hessian_iterations", dest="hessian_iterations", type=int,
                        default=20, help="power-iteration steps for the top Hessian eigenvalue; 0 skips it "
                        "(default: 20)")
    parser.add_argument("--output-dir", "--output_dir", dest="output_dir",
                        help="where diagnostics.json and interpolation.png go (default: <runs>/diagnostics)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hf_dpmerge.analysis.diagnostics import PRIVACY_NOTE, diagnose_runs
    from hf_dpmerge.analysis.interpolation import DEFAULT_GAMMAS

    tasks = parse_tasks(args.tasks)
    check_positive(args, "max_samples", "max_length", "batch_size", "rho")
    report = diagnose_runs(
        args.runs, args.merged, tasks, split=args.split, max_samples=args.max_samples, rho=args.rho,
        gammas=DEFAULT_GAMMAS if args.gammas is None else args.gammas, hessian_iterations=args.hessian_iterations,
        base_dir=args.base,
        tokenizer=load_tokenizer(args.tokenizer), max_length=args.max_length, data_seed=args.data_seed,
        batch_size=args.batch_size, glue_path=args.glue_path, device=args.device,
        log=lambda line: print(line, file=sys.stderr),
    )
    print(report.table())
    paths = report.save(Path(args.output_dir) if args.output_dir else Path(args.runs) / "diagnostics")
    print(f"\nsaved {' and '.join(map(str, paths))}\n{PRIVACY_NOTE}")
    return 0
