"""Validation-tune each merge method's scale λ: every (config, λ) of the grid merged and scored, validation data only.

Each config of ``--configs`` (the shipped task_arithmetic, ties, cauchy_poe and dp; every other parameter as shipped)
gets ``parameters.lambda`` = λ and its ``./runs/`` paths moved to ``--runs`` (:func:`at_runs`); each task's head on the
merged encoder is scored on a seeded stratified subset (``--max_eval_samples``) of its **validation** split, never test:
u(λ) = (1/T)·Σ_t correct_t / n_t. The maintainers' tool for the λ of ``merge_configs/`` (docs/merging.md, "One scale
convention"): its scores are statistics of validation data no DP guarantee covers; a release tunes with
``hf-dpmerge tune``. Report ``benchmarks/reports/tune_scale/TUNE_SCALE.md``.

    python -m benchmarks.studies.tune_scale --runs runs --grid 0.1 0.3 0.5 1.0 --max_eval_samples 300
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from functools import cached_property
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.harness import Unit
from benchmarks.markdown import table
from benchmarks.merging import MERGE_CONFIGS, REPO, run_fingerprints, sweeps
from hf_dpmerge.merging.config_edit import read_merge_config, with_parameter

CONFIGS = [REPO / "merge_configs" / name for name in MERGE_CONFIGS.values()]
RUNS_PREFIX = "./runs/"


def at_runs(config: dict[str, Any], runs: Path) -> dict[str, Any]:
    """``config`` with every ``./runs/`` path (base model, inputs, ``base+adapter`` halves) under ``runs``."""
    def move(path: str) -> str:
        return "+".join(f"{runs}/{part[len(RUNS_PREFIX):]}" if part.startswith(RUNS_PREFIX) else part
                        for part in path.split("+"))

    return {**config, "base_model": move(config["base_model"]),
            "models": [{**entry, "model": move(entry["model"])} for entry in config["models"]]}


class TuneScale(harness.Study, name="tune_scale", schema=1):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--runs", type=Path, default=Path("runs"), help="training output with base/ and <task>/")
        parser.add_argument("--configs", nargs="+", type=Path, default=CONFIGS, help="merge configs to tune")
        parser.add_argument("--grid", nargs="+", type=float, default=[0.1, 0.3, 0.5, 0.7, 1.0], help="λ values")
        parser.add_argument("--tasks", nargs="+", help="run folders to score (default: every one)")
        parser.add_argument("--max_eval_samples", type=int, default=500, help="stratified validation subset per task")
        parser.add_argument("--lora-merge-cache", dest="lora_merge_cache", help="(default: <work-dir>/lora_cache)")
        parser.add_argument("--batch_size", type=int, default=64)
        parser.add_argument("--device", help="torch device (default: cuda when available, else cpu)")

    def plan(self, args: argparse.Namespace) -> list[Unit]:
        self.args, self.runs = args, args.runs.resolve()
        adapters = run_fingerprints(self.runs, args.tasks)
        return [Unit(f"{path.stem}-lambda{lam:g}", {
            "config": path.stem, "lambda": lam, "merge": with_parameter(read_merge_config(path), "lambda", lam),
            "adapters": adapters, "split": "validation", "max_eval_samples": args.max_eval_samples})
            for path in args.configs for lam in args.grid]

    @cached_property
    def validation(self) -> tuple[list, dict[str, Any], Any]:
        """The scored runs, each one's validation subset and the tokenizer (loaded once, for every unit)."""
        from hf_dpmerge.analysis.task_run import find_tokenizer, load_split, task_runs
        from hf_dpmerge.records.run_folders import BASE_DIR

        runs = task_runs(self.runs, self.args.tasks)
        tokenizer = find_tokenizer([runs[0].adapter_dir, self.runs / BASE_DIR])
        return runs, {run.name: load_split(run, "validation", tokenizer, max_samples=self.args.max_eval_samples)
                      for run in runs}, tokenizer

    def run(self, unit: Unit, work_dir: Path) -> dict[str, Any]:
        from hf_dpmerge.analysis.task_models import resolve_device
        from hf_dpmerge.scripts.tune import correct_counts, merge_candidate

        runs, validation, tokenizer = self.validation
        args, merged = self.args, work_dir / unit.name
        shutil.rmtree(merged, ignore_errors=True)
        cache = args.lora_merge_cache or str(work_dir / "lora_cache")
        merge_candidate(at_runs(unit.settings["merge"], self.runs), merged, cache, args.device)
        correct = correct_counts(merged, runs, validation, tokenizer, args.batch_size, resolve_device(args.device))
        shutil.rmtree(merged)
        return {"correct": correct, "n": {name: len(data) for name, data in validation.items()}}

    def report(self, stored: list[dict[str, Any]]) -> dict[str, str | bytes]:
        """Per runs folder and subset size: mean validation accuracy per config and λ, the best λ, and per task."""
        sections = []
        for units in sweeps(stored, "config", "lambda", "merge"):
            adapters, scores = units[0]["settings"]["adapters"], {}
            for unit in sorted(units, key=lambda u: (u["settings"]["config"], u["settings"]["lambda"])):
                s, r = unit["settings"], unit["result"]
                per_task = [r["correct"][t] / r["n"][t] for t in adapters]
                scores[(s["config"], s["lambda"])] = (s["merge"]["merge_method"], statistics.mean(per_task), per_task)
            grid, configs = sorted({lam for _, lam in scores}), list(dict.fromkeys(c for c, _ in scores))
            best = {c: max((lam for lam in grid if (c, lam) in scores), key=lambda lam: scores[(c, lam)][1])
                    for c in configs}
            sections += [
                f"## {len(adapters)} adapters: " + ", ".join(f"{t} ({f[7:15]})" for t, f in adapters.items()), "",
                "Mean validation accuracy over the tasks (examples per task: "
                + ", ".join(f"{t} {n}" for t, n in units[0]["result"]["n"].items()) + "; never test data):", "",
                table(["config", "merge_method", *(f"λ = {lam:g}" for lam in grid), "best λ"],
                      [[c, scores[(c, best[c])][0], *(f"{scores[(c, lam)][1]:.4f}" if (c, lam) in scores else "—"
                                                       for lam in grid), f"{best[c]:g}"] for c in configs]), "",
                table(["config", "λ", "mean", *adapters], [[c, f"{lam:g}", f"{mean:.4f}", *(f"{a:.3f}" for a in tasks)]
                                                          for (c, lam), (_, mean, tasks) in scores.items()]), ""]
        return {"TUNE_SCALE.md": "# Merge scale λ, validation-tuned\n\nGenerated by `python -m benchmarks.studies."
                f"tune_scale --report-only` from {len(stored)} stored units ({__doc__.split(chr(10))[0]}). Each "
                "adapter is named with the start of its fingerprint.\n\n" + "\n".join(sections)}


if __name__ == "__main__":
    sys.exit(harness.main(TuneScale()))
