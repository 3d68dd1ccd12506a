"""The causal-LM chain at full size, as resumable units on disk: private and non-private SmolLM2 adapters trained on
the whole training split on the cached prefix, their merge and the evaluation (docs/causal-lm.md).

Units (each skipped when its output exists, so a killed run resumes where it stopped):

1. ``<out>/runs_causal/<task>/`` — ``examples/train_causal_lm.py`` at ε = ``--epsilon`` with ``RECIPE``;
2. ``<out>/runs_nonprivate/<task>/`` — the same recipe without DP (``--dp false``, no SAM, no alignment);
3. ``<out>/merged_causal/`` — ``mergekit-yaml merge_configs/causal_task_arithmetic.yaml`` (λ = 1, stated fixed);
4. ``<out>/runs_causal/eval/results.json`` — ``hf-dpmerge evaluate`` (zero-shot floor, individual, merged);
5. ``<out>/nonprivate_eval.json`` — the non-private adapters' own test scores.

The report (``--report``) prints one table from the stored units. The recipe is fixed before any run (not tuned on
these tasks' validation splits: there was no time for a search), and stated as such.

    python benchmarks/causal_runs.py --out causal-full --tasks rotten_tomatoes,election_tweets
    python benchmarks/causal_runs.py --out causal-full --tasks rotten_tomatoes,election_tweets --report
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECIPE = ["--lora_layers", "top_4", "--per_device_train_batch_size", "64", "--physical_batch_size", "16",
          "--max_steps", "100", "--learning_rate", "3e-3", "--cache_prefix", "true"]
NON_PRIVATE = ["--dp", "false", "--sam_mode", "none", "--align_lambda", "0"]


def run(command: list[str], cwd: Path, log: Path) -> float:
    start = time.perf_counter()
    with log.open("a") as stream:
        stream.write(f"$ {' '.join(command)}\n")
        stream.flush()
        subprocess.run(command, cwd=cwd, stdout=stream, stderr=subprocess.STDOUT, check=True)
    return time.perf_counter() - start


def train(out: Path, runs: str, tasks: list[str], extra: list[str], times: dict) -> None:
    for task in tasks:
        key = f"{runs}/{task}"
        if (out / runs / task / "eval_metrics.json").exists():
            continue
        shutil.rmtree(out / runs / task, ignore_errors=True)  # a killed unit starts again
        times[key] = run([sys.executable, str(REPO / "examples/train_causal_lm.py"), "--task", task, "--runs_dir",
                          runs, *RECIPE, *extra], out, out / "log.txt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="causal-full")
    parser.add_argument("--tasks", default="rotten_tomatoes,election_tweets")
    parser.add_argument("--epsilon", default="8")
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--max_train_samples", help="train on a seeded stratified subset of this size (default: all)")
    parser.add_argument("--max_eval_samples", help="score a seeded stratified subset of the test split of this size")
    args = parser.parse_args()
    out, tasks = Path(args.out).resolve(), args.tasks.split(",")
    sizes = [part for name in ("max_train_samples", "max_eval_samples") if getattr(args, name)
             for part in (f"--{name}", getattr(args, name))]
    out.mkdir(parents=True, exist_ok=True)
    times_path = out / "times.json"
    times = json.loads(times_path.read_text()) if times_path.exists() else {}
    if not args.report:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        train(out, "runs_causal", tasks, ["--target_epsilon", args.epsilon, *sizes], times)
        times_path.write_text(json.dumps(times, indent=2))
        train(out, "runs_nonprivate", tasks, [*NON_PRIVATE, *sizes], times)
        times_path.write_text(json.dumps(times, indent=2))
        if not (out / "merged_causal" / "config.json").exists():
            shutil.rmtree(out / "merged_causal", ignore_errors=True)
            config = (REPO / "merge_configs/causal_task_arithmetic.yaml").read_text()
            (out / "merge.yaml").write_text(config)
            times["merge"] = run(["mergekit-yaml", "merge.yaml", "merged_causal", "--lora-merge-cache",
                                  "runs_causal/lora_cache"], out, out / "log.txt")
        if not (out / "runs_causal" / "eval" / "results.json").exists():
            evaluate_sizes = ["--max_eval_samples", args.max_eval_samples] if args.max_eval_samples else []
            times["evaluate"] = run(["hf-dpmerge", "evaluate", "--runs", "runs_causal", "--merged", "merged_causal",
                                     "--tasks", args.tasks, *evaluate_sizes], out, out / "log.txt")
        times_path.write_text(json.dumps(times, indent=2))
    results = json.loads((out / "runs_causal" / "eval" / "results.json").read_text())
    print(json.dumps(results, indent=2)[:4000])
    for task in tasks:
        metrics = json.loads((out / "runs_nonprivate" / task / "eval_metrics.json").read_text())
        print(f"non-private {task}: {metrics['test']}")
    print(json.dumps(times, indent=2))


if __name__ == "__main__":
    main()
