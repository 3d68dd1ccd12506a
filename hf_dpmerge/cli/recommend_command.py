"""Which trainer and merge method for these adapters, from their measured interference and DP noise.

Each RUN is a run folder (``runs/<task>``) or a peft adapter folder with its ``dp_privacy.json``. Measures
the pairwise cosine similarity and sign-conflict rate of the task vectors, each adapter's trainer and ε, and
the noise-to-signal ratio its privacy record predicts, then prints the measurements and the advice of the
rules that apply (the head-only check first where the benchmark's floor won at that ε), each with the
measurement that triggered it and the benchmark figure behind it, read from the benchmarks' stored results
(``hf_dpmerge/merging/data/benchmark_evidence.json``). Reads released adapters and records only: no privacy cost.

Example::

    hf-dpmerge recommend runs/rotten_tomatoes runs/election_tweets runs/reuters_r8 runs/bbc_news
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run folders (runs/<task>) or peft adapter folders")
    parser.add_argument("--json", dest="json_path", help="also write the measurements and advice to this JSON file")


def _number(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else ("∞" if math.isinf(value) else f"{value:.3g}")


def run(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from hf_dpmerge.merging.planning.merge_recommendation import measure, recommend
    from hf_dpmerge.merging.planning.task_similarity import load_task_vector, task_similarity

    vectors = [load_task_vector(run) for run in args.runs]
    report = task_similarity(vectors)
    measurements = measure(vectors, report)
    advice = recommend(measurements)
    print(report.table())
    print(f"\n{'adapter':<20}{'trainer':>12}{'ε':>8}{'noise/signal':>14}")
    for name, trainer, epsilon, ratio in zip(measurements.names, measurements.trainers, measurements.epsilons,
                                             measurements.noise_to_signal, strict=True):
        print(f"{name:<20}{trainer:>12}{_number(epsilon):>8}{_number(ratio):>14}")
    print(f"\nmax |cos| {measurements.max_abs_cosine:.3f}, min cos {measurements.min_cosine:.3f}, sign conflicts "
          f"mean {measurements.mean_sign_conflict:.3f} / max {measurements.max_sign_conflict:.3f}\n")
    for item in advice:
        print(f"[{item.topic}] {item.advice}\n    why ({item.rule}): {item.because}")
    if args.json_path:
        path = Path(args.json_path)
        path.write_text(json.dumps({"measurements": asdict(measurements), "advice": [asdict(a) for a in advice]},
                                   indent=2, allow_nan=True) + "\n")
        print(f"\nsaved {path}")
    return 0
