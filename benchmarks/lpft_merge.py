"""The paper's question on private LP-FT adapters: phase 2 by DP-SGD or by DP-Merging (DP-SAT + alignment), merged.

Adapters come from the LP-FT benchmark (``python -m benchmarks.lpft ... --keep-adapters DIR``): for each seed, the
chosen candidate (:data:`TRAINERS` ``dp_sgd``, phase 2 plain DP-SGD) and the same recipe with the package's DP-SAT
step and alignment penalty (``dp_merging``), at ε = 8, on every task of ``--tasks``. Each (trainer, seed, method)
unit merges the tasks' encoder adapters with stock ``mergekit-yaml`` semantics (``hf-dpmerge merge`` on
``merge_configs/<method>.yaml``, its parameters as stored there, base and inputs replaced), scores individual and
merged accuracy on each task's whole test split (:func:`hf_dpmerge.analysis.evaluation.evaluate_runs`), and is
stored as JSON under ``benchmarks/reports/lpft-merge/units``; the report is rewritten from the stored units.

Report (LPFT_MERGE.md), per method and trainer, means over seeds of the task averages: individual and merged
accuracy, interference (individual − merged, points), retention (merged / individual) and gain retained over the
private head of the same seed and task (the LP-FT benchmark's unit: (merged − head) / (individual − head), on the
averaged scores). Per method: DP-Merging − DP-SGD in task-averaged merged accuracy, paired t over seeds (the seed
is the unit: each retrains both), Holm over the methods.

    python -m benchmarks.lpft --stage report --seeds 1,2 --tasks rotten_tomatoes,election_tweets \\
        --keep-adapters runs/lpft/kept                        # DP-SGD (the chosen candidate) and its heads
    python -m benchmarks.lpft --stage report --seeds 1,2 --tasks rotten_tomatoes,election_tweets \\
        --candidates k2_b1024_t75_lr3e-3_head6 --keep-adapters runs/lpft/kept   # DP-Merging
    python -m benchmarks.lpft_merge --kept runs/lpft/kept
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

from scipy import stats

from hf_dpmerge.utils.io import write_text_atomic

from . import lpft
from .markdown import table as markdown_table
from .quality.run import merge_config, run_merge
from .quality.significance import ALPHA, holm

REPORT_DIR = lpft.REPO / "benchmarks" / "reports" / "lpft-merge"
TRAINERS = {"dp_sgd": "k2_b1024_t75_lr3e-3_head6_dpsgd", "dp_merging": "k2_b1024_t75_lr3e-3_head6"}
METHODS = ("task_arithmetic", "ties", "dp_aware", "cauchy_poe")
TASKS = ("rotten_tomatoes", "election_tweets")


def kept_adapter(kept: Path, task: str, trainer: str, seed: int) -> Path:
    return kept / lpft.unit_name(task, TRAINERS[trainer], seed) / task


def complete_seeds(kept: Path, tasks: list[str]) -> list[int]:
    """Seeds with both trainers' adapters kept on every task."""
    found = {int(p.name.rsplit("-seed", 1)[1]) for p in kept.glob("*-seed*")} if kept.is_dir() else set()
    return sorted(s for s in found if all((kept_adapter(kept, t, tr, s) / "encoder_adapter").is_dir()
                                          for t in tasks for tr in TRAINERS))


def run_unit(kept: Path, base: Path, tasks: list[str], trainer: str, seed: int, method: str, work_dir: Path,
             path: Path) -> dict:
    """Merge one (trainer, seed)'s adapters of ``tasks`` with ``method``, evaluate, store the result at ``path``."""
    from hf_dpmerge.analysis.evaluation import evaluate_runs

    cell = work_dir / f"{trainer}-seed{seed}"
    runs = cell / "runs"
    if not runs.is_dir():  # the adapters name their base as ../../base: copies beside a link to the shared base
        staged = cell / "runs.tmp"
        shutil.rmtree(staged, ignore_errors=True)
        staged.mkdir(parents=True)
        (staged / "base").symlink_to(base.resolve(), target_is_directory=True)
        for task in tasks:
            shutil.copytree(kept_adapter(kept, task, trainer, seed), staged / task)
        staged.rename(runs)
    config = merge_config(method, runs / "base", [runs / task / "encoder_adapter" for task in tasks])
    merged = cell / "merged" / method
    start = time.perf_counter()
    run_merge(config, cell / f"{method}.yaml", merged, cell / "lora_cache")
    evaluation = evaluate_runs(runs, merged, tasks, base_dir=runs / "base", progress=False)
    result = {"trainer": trainer, "candidate": TRAINERS[trainer], "seed": seed, "method": method, "tasks": tasks,
              "merge_parameters": config.get("parameters"), "evaluation": evaluation.to_dict(),
              "seconds": time.perf_counter() - start}
    text = json.dumps(result, indent=1, allow_nan=True).replace(str(work_dir), "<work>")  # no path of this machine
    write_text_atomic(path, text + "\n")
    shutil.rmtree(merged, ignore_errors=True)
    return result


def unit_name(trainer: str, seed: int, method: str) -> str:
    return f"{trainer}-seed{seed}-{method}"


def task_average(unit: dict, score: str) -> float:
    """A merge unit's ``score`` ('individual' or 'merged') averaged over its tasks, in %."""
    return 100 * statistics.mean(unit["evaluation"]["tasks"][t][score] for t in unit["tasks"])


def write_report(units: list[dict], heads: dict[tuple[str, int], float], path: Path) -> str:
    """LPFT_MERGE.md from the stored merge units and the private heads' test accuracy (task, seed) → %."""
    by = {(u["trainer"], u["seed"], u["method"]): u for u in units}
    seeds = sorted({s for (_, s, _) in by})
    text = ["# Merging private LP-FT adapters: DP-SGD vs DP-Merging in phase 2 (ε = 8)", "",
            f"Generated by `python -m benchmarks.lpft_merge` from {len(units)} stored units. Test accuracy %, whole "
            "test splits, task averages, means over seeds; gain retained over the private head of the same seed "
            "(benchmarks/reports/lpft/units).", ""]
    rows, comparisons = [], []
    for method in METHODS:
        for trainer in TRAINERS:
            cells = [by[(trainer, s, method)] for s in seeds if (trainer, s, method) in by]
            if not cells:
                continue
            individual = [task_average(c, "individual") for c in cells]
            merged = [task_average(c, "merged") for c in cells]
            head = [statistics.mean(heads.get((t, c["seed"]), float("nan")) for t in c["tasks"]) for c in cells]
            ind, mer, hd = statistics.mean(individual), statistics.mean(merged), statistics.mean(head)
            gain = (mer - hd) / (ind - hd) if ind > hd else float("nan")
            rows.append([method, trainer, ",".join(str(c["seed"]) for c in cells), f"{hd:.1f}", f"{ind:.1f}",
                         f"{mer:.1f}", f"{ind - mer:+.2f}", f"{100 * mer / ind:.1f}",
                         "below head" if gain != gain else f"{100 * gain:.0f} %"])
        paired = [s for s in seeds if all((tr, s, method) in by for tr in TRAINERS)]
        if paired:
            score = {(tr, s): task_average(by[(tr, s, method)], "merged") for tr in TRAINERS for s in paired}
            diffs = [score[("dp_merging", s)] - score[("dp_sgd", s)] for s in paired]
            p = (float(stats.ttest_rel([score[("dp_merging", s)] for s in paired],
                                       [score[("dp_sgd", s)] for s in paired]).pvalue)
                 if len(paired) > 1 and len(set(diffs)) > 1 else None)
            comparisons.append([method, ",".join(map(str, paired)), " ".join(f"{d:+.2f}" for d in diffs),
                                f"{statistics.mean(diffs):+.2f}", p])
    text += ["## Per method and trainer", "",
             markdown_table(["method", "trainer", "seeds", "private head", "individual", "merged",
                             "interference (points)", "retention %", "gain retained"], rows), ""]
    tested = [i for i, c in enumerate(comparisons) if c[-1] is not None]
    adjusted = dict(zip(tested, holm([comparisons[i][-1] for i in tested])))
    for i, c in enumerate(comparisons):
        c[-1:] = (["—", "—"] if i not in adjusted else
                  [f"{c[-1]:.3g}", f"{adjusted[i]:.3g}" + (" *" if adjusted[i] < ALPHA else "")])
    text += ["## DP-Merging − DP-SGD, task-averaged merged accuracy (points)", "",
             markdown_table(["method", "seeds", "per seed", "mean", "p (paired t, seeds)",
                             f"Holm-adjusted p (* < {ALPHA})"], comparisons), "",
             "Trainers: " + "; ".join(f"`{tr}` = LP-FT candidate `{c}`" for tr, c in TRAINERS.items())
             + " (benchmarks/lpft.py). Merge parameters: merge_configs/<method>.yaml as stored.", ""]
    write_text_atomic(path, "\n".join(text))
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lpft_merge", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kept", type=Path, default=lpft.REPO / "runs" / "lpft" / "kept",
                        help="benchmarks.lpft's --keep-adapters folder")
    parser.add_argument("--base", type=Path, default=lpft.REPO / "runs" / "lpft" / "base",
                        help="the shared base the LP-FT units trained on (benchmarks.lpft's <work-dir>/base)")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--methods", default=",".join(METHODS), help="a subset of the merge methods")
    parser.add_argument("--work-dir", type=Path, default=lpft.REPO / "runs" / "lpft-merge")
    parser.add_argument("--units-dir", type=Path, default=REPORT_DIR / "units")
    parser.add_argument("--report", type=Path, default=REPORT_DIR / "LPFT_MERGE.md")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    tasks, methods = args.tasks.split(","), args.methods.split(",")
    if unknown := sorted(set(methods) - set(METHODS)):
        parser.error(f"--methods: unknown {unknown}; the methods are {list(METHODS)}")
    if not args.report_only:
        seeds = complete_seeds(args.kept, tasks)
        if not seeds:
            parser.error(f"--kept {args.kept}: no seed has both trainers' adapters on {', '.join(tasks)}")
        for seed in seeds:
            for trainer in TRAINERS:
                for method in methods:
                    path = args.units_dir / f"{unit_name(trainer, seed, method)}.json"
                    if not path.exists():
                        print(f"[lpft_merge] {path.stem}", file=sys.stderr, flush=True)
                        run_unit(args.kept, args.base, tasks, trainer, seed, method, args.work_dir.resolve(), path)
    units = [json.loads(p.read_text()) for p in sorted(args.units_dir.glob("*.json"))]
    heads = {(u["task"], u["seed"]): 100 * u["test"]["accuracy"] for u in lpft.load_units(lpft.REPORT_DIR / "units")
             if u["candidate"] == lpft.HEAD}
    print(write_report(units, heads, args.report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
