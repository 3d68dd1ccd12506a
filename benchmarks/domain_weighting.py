"""Domain weighting: merged accuracy of every task as one target task's merge weight grows.

For each target weight w the adapters are merged by weighted task arithmetic (or dp_aware), the target with
``weight: w`` and every other task with ``weight: 1`` — W = W₀ + λ·(w·τ_target + Σ_others τ_i), λ from
``merge_configs/`` (0.3) — through ``hf-dpmerge merge`` (mergekit-yaml). Each merge is scored with every task's
own head on a seeded stratified subset of the task's VALIDATION split (``--max_samples``, default 500): the
weight is a choice, so it is never read off test data. Prints a markdown table and the target's least-squares
slope (accuracy points per unit of weight, with its standard error over the swept weights) and writes
``<output_dir>/results.json``, ``domain_weighting.png`` and each weight's config.

    python benchmarks/domain_weighting.py --runs runs --target rotten_tomatoes --weights 0,0.5,1,2,3
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from hf_dpmerge.analysis.evaluation import evaluate_runs
from hf_dpmerge.cli.main import main as hf_dpmerge
from hf_dpmerge.cli.runs_options import parse_tasks
from hf_dpmerge.merging.merge_config import lora_merge_config, merge_config_yaml
from hf_dpmerge.records.run_folders import BASE_DIR

DEFAULT_TASKS = "rotten_tomatoes,election_tweets,reuters_r8,bbc_news"
SPLIT = "validation"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="runs", help="training output with base/ and <task>/encoder_adapter/")
    parser.add_argument("--tasks", default=DEFAULT_TASKS, help=f"tasks in the mix (default: {DEFAULT_TASKS})")
    parser.add_argument("--target", default="rotten_tomatoes", help="the task weighted up (default: rotten_tomatoes)")
    parser.add_argument("--weights", default="0,0.5,1,2,3", help="target weights to sweep (default: 0,0.5,1,2,3)")
    parser.add_argument("--method", default="task_arithmetic", choices=("task_arithmetic", "dp_aware"))
    parser.add_argument("--max_samples", type=int, default=500, help="validation examples per task (default: 500)")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--output_dir", default="runs/domain_weighting")
    args = parser.parse_args(argv)
    args.task_list = parse_tasks(args.tasks)
    if args.target not in args.task_list or len(args.task_list) < 2:
        raise SystemExit(f"--tasks {args.tasks} must hold --target {args.target} and at least one other task")
    try:
        args.weight_list = [float(w) for w in args.weights.split(",")]
    except ValueError:
        raise SystemExit(f"--weights takes comma-separated numbers, got {args.weights!r}") from None
    return args


def sweep(args: argparse.Namespace) -> list[dict]:
    """One merge and one validation evaluation per target weight."""
    runs, out = Path(args.runs).resolve(), Path(args.output_dir)
    base = runs / BASE_DIR
    adapters = [runs / task / "encoder_adapter" for task in args.task_list]
    rows = []
    for weight in args.weight_list:
        weights = [weight if task == args.target else 1.0 for task in args.task_list]
        config = lora_merge_config(args.method, base, adapters, weights=weights)
        config_path = out / f"{args.method}_w{weight:g}.yaml"
        config_path.write_text(merge_config_yaml(config, f"domain weighting: {args.target} at weight {weight:g}"))
        merged = out / "merged"
        start = time.perf_counter()
        code = hf_dpmerge(["merge", str(config_path), str(merged), "--overwrite", "--quiet",
                           "--lora-merge-cache", str(out / "lora_cache")])
        if code != 0:
            raise RuntimeError(f"hf-dpmerge merge {config_path} failed with exit status {code}")
        report = evaluate_runs(runs, merged, args.task_list, split=SPLIT, max_eval_samples=args.max_samples,
                               batch_size=args.batch_size, log=lambda line: print(line, file=sys.stderr))
        shutil.rmtree(merged)
        rows.append({"weight": weight, "seconds": time.perf_counter() - start,
                     "tasks": {t.task: {"merged": t.merged, "individual": t.individual, "n": t.num_examples}
                               for t in report.tasks}})
        print(f"weight {weight:g}: " + ", ".join(f"{t.task} {t.merged:.3f}" for t in report.tasks), file=sys.stderr)
    return rows


def table(rows: list[dict], tasks: list[str], target: str) -> str:
    header = ["target weight", *tasks, "others' mean"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    individual = rows[0]["tasks"]
    lines.append("| individual | " + " | ".join(f"{100 * individual[t]['individual']:.1f}" for t in tasks) + " | |")
    for row in rows:
        others = [row["tasks"][t]["merged"] for t in tasks if t != target]
        cells = [f"{100 * row['tasks'][t]['merged']:.1f}" for t in tasks]
        lines.append(f"| {row['weight']:g} | " + " | ".join(cells) + f" | {100 * sum(others) / len(others):.1f} |")
    return "\n".join(lines)


def target_slope(rows: list[dict], target: str) -> tuple[float, float]:
    """Least-squares slope of the target's accuracy (points) on its weight, and its standard error:
    b = Σ(w − w̄)(a − ā)/Σ(w − w̄)², SE = √(Σ residual²/(k − 2) / Σ(w − w̄)²) over the k swept weights."""
    weights = [row["weight"] for row in rows]
    points = [100 * row["tasks"][target]["merged"] for row in rows]
    k = len(weights)
    mean_w, mean_a = sum(weights) / k, sum(points) / k
    if len(set(weights)) < 3:
        raise ValueError("the slope needs at least three different --weights")
    spread = sum((w - mean_w) ** 2 for w in weights)
    slope = sum((w - mean_w) * (a - mean_a) for w, a in zip(weights, points)) / spread
    residual = sum((a - mean_a - slope * (w - mean_w)) ** 2 for w, a in zip(weights, points))
    return slope, (residual / (k - 2) / spread) ** 0.5


def plot(rows: list[dict], tasks: list[str], target: str, method: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    weights = [row["weight"] for row in rows]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for task in tasks:
        style = {"linewidth": 2.5} if task == target else {"linestyle": "--", "alpha": 0.8}
        ax.plot(weights, [100 * row["tasks"][task]["merged"] for row in rows], marker="o", label=task, **style)
    ax.set_xlabel(f"merge weight of {target} (others 1)")
    ax.set_ylabel("validation accuracy of the merged model (%)")
    ax.set_title(f"Domain weighting: weighted {method}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = sweep(args)
    slope, error = target_slope(rows, args.target) if len({row["weight"] for row in rows}) >= 3 else (None, None)
    (out / "results.json").write_text(json.dumps({
        "command": " ".join(sys.argv), "split": SPLIT, "max_samples": args.max_samples, "method": args.method,
        "target": args.target, "tasks": args.task_list, "rows": rows,
        "target_slope": slope, "target_slope_se": error}, indent=2) + "\n")
    plot(rows, args.task_list, args.target, args.method, out / "domain_weighting.png")
    print(table(rows, args.task_list, args.target))
    if slope is not None:
        print(f"\n{args.target}: {slope:+.2f} accuracy points per unit of weight (SE {error:.2f}, "
              f"least squares over {len(rows)} weights)")
    print(f"\nsaved {out / 'results.json'} and {out / 'domain_weighting.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
