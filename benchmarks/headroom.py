"""The headroom table: how much a non-private LoRA adapter beats the non-private linear head on each packaged task.

A private adapter can only capture what a non-private one gains over the head; this measures that gain first.
Per task and seed, non-private (``--dp false``, no SAM, no alignment), each arm trained by ``train_glue.py``'s own
code and scored on the validation and the whole test split:

- ``head`` — the floor's recipe (``--train_lora false``: ``HEAD_ONLY_RECIPE``, head on cached pooled features);
- ``lora_top2`` — LoRA r = 8 on query/value of the top 2 of 6 layers, A and the head trained, on the cached prefix:
  ``LORA_STEPS`` steps of 64 rows (AdamW, constant lr 1e-3, head 3e-3): the budget a DP run can afford here;
- ``lora_all`` — the same on all six layers (no prefix to cache): the ceiling, not the budget.

A task whose adapter within the budget (``lora_top2``) beats the head by ≥ 2 test points is a *headroom task*; the
ceiling (``lora_all``) is reported beside it, not used for the headroom a private adapter is asked to capture.
Units are stored as JSON under ``benchmarks/reports/headroom/units/`` (a killed run resumes); the report is
rewritten from them.

    python -m benchmarks.headroom                      # seed 0 on every task, then the report
    python -m benchmarks.headroom --seeds 0,1,2 --tasks rotten_tomatoes,election_tweets
    python -m benchmarks.headroom --report-only
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
from pathlib import Path

from hf_dpmerge.data.tasks import PACKAGED_TASKS
from hf_dpmerge.utils.io import write_text_atomic

from .markdown import table as markdown_table
from .recipe.run import NON_PRIVATE_FLAGS, train_in_process, validation_metrics

REPO = Path(__file__).resolve().parent.parent
REPORT_DIR = REPO / "benchmarks" / "reports" / "headroom"
LORA_STEPS = 600
HEADROOM_POINTS = 2.0
_LORA = ("--cache_prefix", "auto", "--lora_freeze_a", "false", "--head_warmup_steps", "0",
         "--per_device_train_batch_size", "64", "--physical_batch_size", "64", "--max_steps", str(LORA_STEPS),
         "--learning_rate", "1e-3", "--head_learning_rate", "3e-3", "--logging_steps", "100")
ARMS: dict[str, tuple[str, ...]] = {
    "head": ("--train_lora", "false"),
    "lora_top2": ("--lora_layers", "top_2", *_LORA),
    "lora_all": ("--lora_layers", "all", *_LORA),
}
BUDGET_ARMS = ("lora_top2",)  # what a DP run can afford here: the headroom it is asked to capture
CEILING_ARMS = ("lora_all",)  # the ceiling, reported beside it


def arguments(task: str, arm: str, seed: int, runs_dir: Path) -> list[str]:
    return [*ARMS[arm], *NON_PRIVATE_FLAGS, "--task", task, "--seed", str(seed), "--runs_dir", str(runs_dir),
            "--overwrite", "true", "--disable_tqdm", "true"]


def run_unit(task: str, argv: list[str], seed: int, work_dir: Path, path: Path, keep: Path | None = None,
             **about: object) -> dict:
    """Train ``task`` with train_glue.py's ``argv`` (its ``--runs_dir`` under ``work_dir``; deleted afterwards,
    except the released folders, moved to ``keep/<path's stem>/<task>/`` when ``keep`` is given), score it on the
    validation and the whole test split, store the result (and ``about``) at ``path``."""
    runs_dir = Path(argv[argv.index("--runs_dir") + 1])
    summary, seconds, base_dir = train_in_process(task, argv, seed, work_dir)
    named = [("<runs>" if a == str(runs_dir) else a.replace(str(work_dir), "<work>")) for a in argv]
    result = {"task": task, "seed": seed, **about, "argv": named,
              "test": summary["test"], "validation": validation_metrics(task, runs_dir, base_dir),
              "train_seconds": seconds, "steps": summary["steps"], "epsilon": summary["epsilon"]}
    if keep is not None:  # before the unit counts as done: a kept unit always has its adapter
        kept = keep / path.stem / task
        shutil.rmtree(kept, ignore_errors=True)
        kept.mkdir(parents=True)
        for name in ("adapter", "encoder_adapter", "eval_metrics.json"):
            shutil.move(runs_dir / task / name, kept / name)
    write_text_atomic(path, json.dumps(result, indent=1, allow_nan=True) + "\n")
    shutil.rmtree(runs_dir, ignore_errors=True)
    gc.collect()
    return result


def _cells(units: list[dict]) -> dict[tuple[str, str], list[dict]]:
    by_cell: dict[tuple[str, str], list[dict]] = {}
    for unit in units:
        by_cell.setdefault((unit["task"], unit["arm"]), []).append(unit)
    return by_cell


def _mean(by_cell: dict[tuple[str, str], list[dict]], task: str, arm: str, split: str) -> float | None:
    cell = by_cell.get((task, arm), [])
    return statistics.mean(u[split]["accuracy"] for u in cell) * 100 if cell else None


def headroom_points(units: list[dict], arms: tuple[str, ...] = BUDGET_ARMS) -> dict[str, float]:
    """Per task with a head unit and a unit of one of ``arms``: max over those arms of the arm's mean test accuracy
    − the head's (points, each arm averaged over its own seeds). By default the arms within the budget."""
    by_cell = _cells(units)
    points = {}
    for task in PACKAGED_TASKS:
        lora = [m for arm in arms if (m := _mean(by_cell, task, arm, "test")) is not None]
        if (head := _mean(by_cell, task, "head", "test")) is not None and lora:
            points[task] = max(lora) - head
    return points


def write_report(units: list[dict], path: Path) -> str:
    """HEADROOM.md: per task, each arm's mean validation / test accuracy over its seeds, and the headroom."""
    by_cell, points, ceiling = _cells(units), headroom_points(units), headroom_points(units, CEILING_ARMS)

    def cell(value: float | None) -> str:
        return "—" if value is None else f"{value:.1f}"

    rows = []
    headroom_tasks = [task for task, gain in points.items() if gain >= HEADROOM_POINTS]
    for task in PACKAGED_TASKS:
        if (task, "head") not in by_cell:
            continue
        seeds = sorted({u["seed"] for a in ARMS for u in by_cell.get((task, a), [])})
        minutes = [u["train_seconds"] / 60 for a in ARMS for u in by_cell.get((task, a), [])]
        rows.append([task, ",".join(map(str, seeds)),
                     *(f"{cell(_mean(by_cell, task, arm, 'validation'))} / {cell(_mean(by_cell, task, arm, 'test'))}"
                       for arm in ARMS),
                     cell(points.get(task)), cell(ceiling.get(task)), f"{max(minutes):.1f}"])
    table = markdown_table(["task", "seeds", "head (val / test)", "LoRA top 2 (val / test)",
                            "LoRA all 6 (val / test)", "headroom (test points)", "ceiling − head (test points)",
                            "longest unit (min)"], rows)
    text = (f"# Headroom: non-private LoRA vs the non-private head\n\nGenerated by `python -m benchmarks.headroom"
            f" --report-only` from {len(units)} stored units ({__doc__.split(chr(10))[0]}).\n\nAccuracy in %, mean over"
            " the seeds listed; validation = the task's validation split (10 % of train, seeded), test = the whole"
            " test split. Headroom = LoRA top 2 (the budget) − head on test; ceiling = LoRA on all six layers − head."
            "\n\n"
            f"{table}\n\nHeadroom tasks (≥ {HEADROOM_POINTS:g} points): "
            f"{', '.join(headroom_tasks) if headroom_tasks else 'none'}.\n\n"
            + "\n".join(f"- `{arm}`: `{' '.join(flags)}`" for arm, flags in ARMS.items()) + "\n")
    write_text_atomic(path, text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.headroom", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=",".join(PACKAGED_TASKS))
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--work-dir", type=Path, default=REPO / "runs" / "headroom")
    parser.add_argument("--units-dir", type=Path, default=REPORT_DIR / "units")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    if not args.report_only:
        for seed in map(int, args.seeds.split(",")):
            for task in args.tasks.split(","):
                for arm in args.arms.split(","):
                    path = args.units_dir / f"{task}-{arm}-seed{seed}.json"
                    if path.exists():
                        continue
                    print(f"[headroom] {path.stem}", file=sys.stderr, flush=True)
                    runs_dir = args.work_dir.resolve() / path.stem
                    run_unit(task, arguments(task, arm, seed, runs_dir), seed, args.work_dir.resolve(), path, arm=arm)
    units = [json.loads(p.read_text()) for p in sorted(args.units_dir.glob("*.json"))]
    print(write_report(units, REPORT_DIR / "HEADROOM.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
