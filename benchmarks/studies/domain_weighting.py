"""Domain weighting: every task's merged validation accuracy as one target task's merge weight w grows.

Per w, the ``--tasks`` adapters of ``--runs`` are merged by weighted ``--method`` (task_arithmetic or dp_aware), the
target at ``weight: w``, the others at 1: W = W₀ + λ·(w·τ_target + Σ_others τ_i), λ and the rest as
``hf_dpmerge.merging.merge_config.METHOD_PARAMETERS`` sets them. Every task's own head is scored on a seeded stratified
subset (``--max_samples``) of its VALIDATION split, never test (the weight is a choice). Per sweep the report has the
table, the target's least-squares slope b = Σ(w − w̄)(a − ā)/Σ(w − w̄)² with its SE, and a plot
(``benchmarks/reports/domain_weighting/``; docs/merging.md, "Domain weighting").

    python -m benchmarks.studies.domain_weighting --runs runs --target rotten_tomatoes --weights 0,0.5,1,2,3
"""

from __future__ import annotations

import argparse
import io
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.harness import Unit
from benchmarks.markdown import table
from benchmarks.merging import run_fingerprints, run_merge, sweeps
from hf_dpmerge.data.tasks import parse_task_list
from hf_dpmerge.merging.merge_config import METHOD_PARAMETERS, lora_merge_config


def merged_points(unit: dict[str, Any], task: str) -> float:
    return 100 * unit["result"]["tasks"][task]["merged"]


def target_slope(units: list[dict[str, Any]], target: str) -> tuple[float, float]:
    """Least-squares slope of the target's accuracy (points) on its weight, and its standard error:
    b = Σ(w − w̄)(a − ā)/Σ(w − w̄)², SE = √(Σ residual²/(k − 2) / Σ(w − w̄)²) over the k swept weights."""
    weights, points = [u["settings"]["weight"] for u in units], [merged_points(u, target) for u in units]
    if len(set(weights)) < 3:
        raise ValueError("the slope needs at least three different --weights")
    mean_w, mean_a = statistics.mean(weights), statistics.mean(points)
    spread = sum((w - mean_w) ** 2 for w in weights)
    slope = sum((w - mean_w) * (a - mean_a) for w, a in zip(weights, points)) / spread
    residual = sum((a - mean_a - slope * (w - mean_w)) ** 2 for w, a in zip(weights, points))
    return slope, (residual / (len(weights) - 2) / spread) ** 0.5


def plot(units: list[dict[str, Any]], target: str, method: str) -> bytes:
    """Each task's merged accuracy against the target's weight (the target bold, the others dashed), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for task in units[0]["settings"]["adapters"]:
        style = {"linewidth": 2.5} if task == target else {"linestyle": "--", "alpha": 0.8}
        ax.plot([u["settings"]["weight"] for u in units], [merged_points(u, task) for u in units], marker="o",
                label=task, **style)
    ax.set_xlabel(f"merge weight of {target} (others 1)")
    ax.set_ylabel("validation accuracy of the merged model (%)")
    ax.set_title(f"Domain weighting: weighted {method}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png := io.BytesIO(), format="png", dpi=120)
    plt.close(fig)
    return png.getvalue()


class DomainWeighting(harness.Study, name="domain_weighting", schema=1):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--runs", type=Path, default=Path("runs"), help="training output: base/, <task>/")
        parser.add_argument("--tasks", default="rotten_tomatoes,election_tweets,reuters_r8,bbc_news", help="the mix")
        parser.add_argument("--target", default="rotten_tomatoes", help="the task weighted up")
        parser.add_argument("--weights", default="0,0.5,1,2,3", help="the target's weights, comma-separated")
        parser.add_argument("--method", default="task_arithmetic", choices=("task_arithmetic", "dp_aware"))
        parser.add_argument("--max_samples", type=int, default=500, help="validation examples per task (default: 500)")
        parser.add_argument("--batch_size", type=int, default=64)

    def plan(self, args: argparse.Namespace) -> list[Unit]:
        tasks = parse_task_list(args.tasks)
        if args.target not in tasks or len(tasks) < 2:
            raise ValueError(f"--tasks {args.tasks} must hold --target {args.target} and at least one other task")
        try:
            weights = [float(w) for w in args.weights.split(",")]
        except ValueError:
            raise ValueError(f"--weights takes comma-separated numbers, got {args.weights!r}") from None
        self.runs, self.batch_size = args.runs.resolve(), args.batch_size
        settings = {"method": args.method, "parameters": METHOD_PARAMETERS[args.method], "target": args.target,
                    "adapters": run_fingerprints(self.runs, tasks), "split": "validation",
                    "max_samples": args.max_samples}
        return [Unit(f"{args.method}-{args.target}-w{w:g}", {**settings, "weight": w}) for w in weights]

    def run(self, unit: Unit, work_dir: Path) -> dict[str, Any]:
        from hf_dpmerge.analysis.evaluation import evaluate_runs
        from hf_dpmerge.records.run_folders import BASE_DIR, ENCODER_ADAPTER_DIR

        s, tasks, merged = unit.settings, list(unit.settings["adapters"]), work_dir / unit.name
        work_dir.mkdir(parents=True, exist_ok=True)
        adapters = [self.runs / t / ENCODER_ADAPTER_DIR for t in tasks]
        config = lora_merge_config(s["method"], self.runs / BASE_DIR, adapters, parameters=s["parameters"],
                                   weights=[s["weight"] if t == s["target"] else 1.0 for t in tasks])
        run_merge(config, work_dir / f"{unit.name}.yaml", merged, work_dir / "lora_cache")
        report = evaluate_runs(self.runs, merged, tasks, split=s["split"], batch_size=self.batch_size,
                               max_eval_samples=s["max_samples"], log=lambda line: print(line, file=sys.stderr))
        shutil.rmtree(merged)
        return {"tasks": {t.task: {"merged": t.merged, "individual": t.individual, "n": t.num_examples}
                          for t in report.tasks}}

    def report(self, stored: list[dict[str, Any]]) -> dict[str, str | bytes]:
        """Per sweep: the table of merged accuracy by weight, the target's slope and the plot."""
        files: dict[str, str | bytes] = {}
        sections: list[str] = []
        for units in sweeps(stored, "weight"):
            units.sort(key=lambda u: u["settings"]["weight"])
            s = units[0]["settings"]
            method, target, tasks = s["method"], s["target"], list(s["adapters"])
            name = f"{method}-{target}" + (f"-{len(files)}" if f"{method}-{target}.png" in files else "")
            files[f"{name}.png"] = plot(units, target, method)
            rows = [["individual", *(f"{100 * units[0]['result']['tasks'][t]['individual']:.1f}" for t in tasks), ""],
                    *([f"{u['settings']['weight']:g}", *(f"{merged_points(u, t):.1f}" for t in tasks),
                       f"{statistics.mean(merged_points(u, t) for t in tasks if t != target):.1f}"] for u in units)]
            sections += [f"## {method}, target {target}, {s['max_samples']} validation examples per task", "",
                         table(["target weight", *tasks, "others' mean"], rows), ""]
            if len({u["settings"]["weight"] for u in units}) >= 3:
                slope, error = target_slope(units, target)
                sections += [f"{target}: {slope:+.2f} accuracy points per unit of weight (SE {error:.2f}, least "
                             f"squares over {len(units)} weights).", ""]
            sections += [f"![{name}]({name}.png)", ""]
        return {**files, "DOMAIN_WEIGHTING.md": "# Domain weighting\n\nGenerated by `python -m benchmarks.studies."
                f"domain_weighting --report-only` from {len(stored)} stored units ({__doc__.split(chr(10))[0]})."
                "\n\n" + "\n".join(sections)}


if __name__ == "__main__":
    sys.exit(harness.main(DomainWeighting()))
