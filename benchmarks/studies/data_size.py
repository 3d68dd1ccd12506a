"""How much data does DP need to pay off? The default recipe on subsamples of N training rows (docs/workflow.md
"How much data").

Per task, N and seed: the private adapter (train_glue.py's default, batch and steps fitted to N by
``hf_dpmerge/scripts/data_size.py``), the same with the recipe's 75 encoder steps kept (``adapter_recipe_steps``),
the private head at the same ε and the non-private head, on the first N rows of the seeded stratified subsample,
scored on the whole test split; N at or above the split is the whole split (the lpft study's units). Seeds are the
unit of the paired t-tests, Holm over each table's rows; nothing is tuned on the test split.

    python -m benchmarks.studies.data_size --tasks rotten_tomatoes,bbc_news --sizes 100,300,1000,3000 --seeds 0,1,2
    python -m benchmarks.studies.data_size --epsilons 4,16 --sizes 300,1000   # the ε each N needs
    python -m benchmarks.studies.data_size --report-only
"""

from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.harness import Unit
from benchmarks.markdown import mean_sd, table
from benchmarks.significance import ALPHA, holm_adjusted, paired_p
from hf_dpmerge.scripts.data_size import MAX_SAMPLE_RATE, RULE, fitted_steps
from hf_dpmerge.training.recipe import LPFT_RECIPE, recipe_value

ARMS = {"private_head": ["--train_lora", "false"], "nonprivate_head": ["--train_lora", "false", "--dp", "false"],
        "adapter": [], "adapter_recipe_steps": ["--max_steps", "75", "--head_phase_steps", "1000"],
        "adapter_fitted_steps": ["--max_steps", "{fitted_steps}", "--head_phase_steps", "1000"]}
"""Each arm's flags; ``adapter`` is the default (``RULE``: steps fitted, learning rates scaled), the other adapter arms
the rule's ablations: the recipe's 75 steps, and the fitted steps at the recipe's learning rates."""
DEFAULT_ARMS = ("private_head", "nonprivate_head", "adapter")
ABLATIONS = {"adapter_recipe_steps": "75 steps, recipe lr", "adapter_fitted_steps": "fitted steps, recipe lr"}
LPFT_DEFAULT = {"adapter": "k2_b1024_t75_lr1e-2_head6_dpsgd", "private_head": "private_head"}
"""The lpft study's candidates that are the packaged default recipe (its whole-split units)."""
RECIPE_BATCH, RECIPE_STEPS = (int(recipe_value(LPFT_RECIPE, flag)) for flag in ("--per_device_train_batch_size",
                                                                                  "--max_steps"))
FULL = 0
"""N = 0 stands for the whole training split."""


class DataSize(harness.Study, name="data_size", schema=1):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--tasks", default="rotten_tomatoes,bbc_news")
        parser.add_argument("--sizes", default="100,300,1000,3000", help="N; 0 is the whole training split")
        parser.add_argument("--seeds", default="0,1,2")
        parser.add_argument("--epsilons", default="8")
        parser.add_argument("--arms", default=",".join(DEFAULT_ARMS), help=f"of {', '.join(ARMS)}")

    def plan(self, args: argparse.Namespace) -> list[Unit]:
        """Cheapest first (N ascending, heads before adapters), so a partial run already answers the small N; an N at
        or above a task's training split is planned once, as N = 0 (the whole split)."""
        from hf_dpmerge.data.load import load_task

        tasks = args.tasks.split(",")
        rows = {task: load_task(task).splits["train"].num_rows for task in tasks}
        sizes = sorted(map(int, args.sizes.split(",")), key=lambda n: n or sys.maxsize)
        units = []
        for n in sizes:
            for arm in args.arms.split(","):
                for epsilon in map(float, args.epsilons.split(",")):
                    if arm == "nonprivate_head" and epsilon != 8:
                        continue  # no ε: once
                    for task in tasks:
                        if n >= rows[task] or (n == FULL and arm in LPFT_DEFAULT and epsilon == 8):
                            continue  # the whole split: once, and the lpft study's units where it has them
                        for seed in map(int, args.seeds.split(",")):
                            settings = {"task": task, "n": n, "arm": arm, "seed": seed,
                                        "epsilon": None if arm == "nonprivate_head" else epsilon}
                            if arm == "adapter":
                                settings["rule"] = RULE
                            eps = "" if settings["epsilon"] is None else f"-eps{epsilon:g}"
                            units.append(Unit(f"{task}-n{n or 'full'}-{arm}{eps}-seed{seed}", settings))
        return units

    def run(self, unit: Unit, work_dir: Path) -> dict[str, Any]:
        from benchmarks.training import train_in_process, validation_metrics
        from hf_dpmerge.records.record import PrivacyRecord

        s = unit.settings
        runs_dir = work_dir / unit.name
        batch = min(RECIPE_BATCH, int(MAX_SAMPLE_RATE * s["n"])) if s["n"] else RECIPE_BATCH
        steps = fitted_steps(RECIPE_STEPS, batch, RECIPE_BATCH)
        argv = [*(flag.format(fitted_steps=steps) for flag in ARMS[s["arm"]]), "--task", s["task"],
                "--seed", str(s["seed"]), "--runs_dir", str(runs_dir),
                "--overwrite", "true", "--disable_tqdm", "true", "--prefix_cache_dir", str(work_dir / "prefix_cache")]
        argv += ["--max_train_samples", str(s["n"])] if s["n"] else []
        argv += ["--target_epsilon", f"{s['epsilon']:g}"] if s["epsilon"] is not None else []
        summary, seconds, base_dir = train_in_process(s["task"], argv, s["seed"], work_dir)
        record = PrivacyRecord.load(runs_dir / s["task"] / "adapter")
        result = {"test": summary["test"]["accuracy"],
                  "validation": validation_metrics(s["task"], runs_dir, base_dir)["accuracy"],
                  "rows": record.num_samples, "expected_batch_size": record.expected_batch_size,
                  "steps": record.steps, "epsilon": summary["epsilon"], "train_seconds": round(seconds, 1)}
        shutil.rmtree(runs_dir, ignore_errors=True)
        gc.collect()
        return result

    def report(self, stored: list[dict[str, Any]]) -> dict[str, str]:
        cells = _cells(stored)
        keys = sorted({(task, n, eps) for task, n, arm, eps in cells if arm == "adapter"},
                      key=lambda k: (k[0], k[1] or sys.maxsize, k[2]))
        rows, tests = [], []
        for task, n, eps in keys:
            adapter, head = cells[(task, n, "adapter", eps)], cells.get((task, n, "private_head", eps), {})
            nonprivate = cells.get((task, n, "nonprivate_head", None), {})
            gains, p = _paired(adapter, head, "test")
            tests.append(p)
            rows.append([task, _rows(adapter), f"{eps:g}", ",".join(map(str, sorted(set(adapter) & set(head)))),
                         _mean(adapter), _mean(head), _mean(nonprivate), _mean_points(gains), _p(p), _minutes(adapter)])
        _insert_holm(rows, tests, 9)
        header = ["task", "N", "ε", "seeds", "private adapter", "private head", "non-private head",
                  "adapter − head (points)", "p", "Holm", "adapter min"]
        steps_rows, steps_tests = [], []
        for task, n, eps in keys:
            fitted = cells[(task, n, "adapter", eps)]
            for arm, label in ABLATIONS.items():
                other = cells.get((task, n, arm, eps))
                if not other:
                    continue
                gains, p = _paired(fitted, other, "validation")
                steps_tests.append(p)
                steps_rows.append([task, _rows(fitted), f"{eps:g}", label, _steps(fitted), _steps(other),
                                   _mean(fitted, "validation"), _mean(other, "validation"), _mean_points(gains),
                                   _p(p), _mean(fitted), _mean(other), _minutes(fitted), _minutes(other)])
        _insert_holm(steps_rows, steps_tests, 10)
        steps_header = ["task", "N", "ε", "against", "steps", "its steps", "default (val)", "it (val)",
                        "default − it (val points)", "p", "Holm", "default (test)", "it (test)", "default min",
                        "its min"]
        return {"REPORT.md": "# How much data: the default recipe by training-set size\n\n"
                "Generated by `python -m benchmarks.studies.data_size` from its stored units (N = all: the lpft "
                "study's default-recipe units); test accuracy (%) on the whole test split, mean ± sd over seeds; N "
                "the training rows; paired t-test over seeds, Holm over the table's rows "
                f"(* < {ALPHA}).\n\n" + table(header, rows) + "\n" + _needed(rows)
                + "\n## The rule against its ablations\n\n"
                f"Accuracy (%) of the private adapter by the default rule ({RULE}) against the recipe's 75 steps "
                "at its learning rates (`--max_steps 75 --head_phase_steps 1000`) and against the fitted steps at "
                "the recipe's learning rates (`--max_steps T --head_phase_steps 1000`): same batch B, ε, rows and "
                "seeds; compared on the validation split (paired over seeds, Holm over the rows), the test split "
                "shown beside.\n\n" + table(steps_header, steps_rows)}


def _cells(stored: list[dict[str, Any]]) -> dict[tuple, dict[int, dict]]:
    """(task, N, arm, ε) → seed → result, this study's units and the lpft study's whole-split default units."""
    cells: dict[tuple, dict[int, dict]] = {}
    for unit in stored:
        s = unit["settings"]
        cells.setdefault((s["task"], s["n"], s["arm"], s["epsilon"]), {})[s["seed"]] = unit["result"]
    tasks = {task for task, *_ in cells}
    for unit in harness.stored("lpft", 1):
        s, r = unit["settings"], unit["result"]
        arms = [arm for arm, candidate in LPFT_DEFAULT.items() if candidate == s["candidate"]]
        if arms and s["base"] == "minilm" and s["task"] in tasks and s["target_epsilon"] == 8:
            cells.setdefault((s["task"], FULL, arms[0], 8.0), {})[s["seed"]] = {
                "test": r["test"]["accuracy"], "validation": r["validation"]["accuracy"], "steps": r["steps"],
                "train_seconds": r["train_seconds"]}
    return cells


def _paired(a: dict, b: dict, split: str) -> tuple[list[float], float | None]:
    """Per common seed, 100·(a − b) on ``split``, and the paired t-test's p (None with < 2 seeds or no spread)."""
    seeds = sorted(set(a) & set(b))
    return ([100 * (a[s][split] - b[s][split]) for s in seeds],
            paired_p([a[s][split] for s in seeds], [b[s][split] for s in seeds]))


def _insert_holm(rows: list[list[str]], tests: list[float | None], column: int) -> None:
    for row, q in zip(rows, holm_adjusted(tests)):
        row.insert(column, "–" if q is None else _p(q) + (" *" if q < ALPHA else ""))


def _rows(by_seed: dict) -> str:
    return str(next(iter(by_seed.values())).get("rows", "all"))


def _steps(by_seed: dict) -> str:
    return str(next(iter(by_seed.values()))["steps"])


def _needed(rows: list[list[str]]) -> str:
    """Per (task, N) measured at several ε, from the main table's rows: adapter − head at each ε, the smallest ε at
    which the adapter's mean is ahead and the smallest at which it is ahead significantly (Holm)."""
    grids: dict[tuple[str, str], list[list[str]]] = {}
    for row in rows:
        grids.setdefault((row[0], row[1]), []).append(row)
    lines = []
    for (task, n), grid in grids.items():
        if len(grid) < 2:
            continue
        ahead = [row[2] for row in grid if row[7] != "–" and float(row[7]) > 0]
        significant = [row[2] for row in grid if row[7] != "–" and float(row[7]) > 0 and row[9].endswith("*")]
        lines.append(f"- {task}, N = {n}: adapter − head " + ", ".join(f"{row[7]} at ε = {row[2]}" for row in grid)
                     + " points; the mean is ahead " + (f"from ε = {ahead[0]}" if ahead else "at no ε of the grid")
                     + ", significantly (Holm) " + (f"from ε = {significant[0]}" if significant else "at none"))
    return ("\nThe ε each N needs for the adapter to beat the head:\n\n" + "\n".join(lines) + "\n") if lines else ""


def _mean(by_seed: dict, split: str = "test") -> str:
    return mean_sd([100 * r[split] for r in by_seed.values()])


def _mean_points(gains: list[float]) -> str:
    return "–" if not gains else f"{statistics.fmean(gains):+.2f}"


def _p(p: float | None) -> str:
    return "–" if p is None else f"{p:.3f}"


def _minutes(by_seed: dict) -> str:
    return f"{statistics.fmean(r['train_seconds'] for r in by_seed.values()) / 60:.1f}"


if __name__ == "__main__":
    sys.exit(harness.main(DataSize()))
