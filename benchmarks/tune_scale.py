"""Validation-tune each merge method's scale λ: merge at every λ of a grid, score mean validation accuracy.

For each config in ``--configs`` (default: task_arithmetic, ties, cauchy_poe and dp_aware from
``merge_configs/``, every other parameter as the config sets it) and each λ of ``--grid``, the config's
``parameters.lambda`` is set to λ, the ``./runs/`` paths point at ``--runs``, and the merge runs through
mergekit (:func:`hf_dpmerge.scripts.tune.merge_candidate`). Each task's head is put on the merged encoder and
scored on a seeded stratified subset (``--max_eval_samples``) of the task's **validation** split — never
test; the chosen λ is scored on test once, afterwards, with ``hf-dpmerge evaluate``. Prints the table of
accuracy averaged over tasks, the best λ per method, and writes it all to ``<workdir>/tune_scale.json``.

This is the maintainers' tool for the defaults in ``merge_configs/``; it prints the validation scores, which
are statistics of the validation data, not covered by any DP guarantee. To choose λ for a release on private
validation data use ``hf-dpmerge tune`` (an ε-DP selection that never prints the scores).
Usage: ``python benchmarks/tune_scale.py --runs runs [--grid 0.1 0.3 0.5 0.7 1.0] [--configs ...]
[--max_eval_samples 500] [--workdir runs/tune_scale] [--lora-merge-cache runs/lora_cache]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from hf_dpmerge.analysis.task_models import resolve_device
from hf_dpmerge.analysis.task_run import discover_tasks, find_tokenizer, load_split, task_runs
from hf_dpmerge.merging.config_edit import read_merge_config, with_parameter
from hf_dpmerge.records.run_folders import BASE_DIR
from hf_dpmerge.scripts.tune import correct_counts, merge_candidate
from hf_dpmerge.training.dp.private_selection import task_averaged_accuracy

REPO = Path(__file__).resolve().parents[1]
CONFIGS = [REPO / "merge_configs" / f"{name}.yaml" for name in ("task_arithmetic", "ties", "cauchy_poe", "dp")]
RUNS_PREFIX = "./runs/"


def at_runs(config: dict[str, Any], runs: Path) -> dict[str, Any]:
    """``config`` with every ``./runs/`` path (base model, inputs, ``base+adapter`` halves) under ``runs``."""
    def move(path: str) -> str:
        return "+".join(f"{runs}/{part[len(RUNS_PREFIX):]}" if part.startswith(RUNS_PREFIX) else part
                        for part in path.split("+"))

    moved = {**config, "base_model": move(config["base_model"])}
    moved["models"] = [{**entry, "model": move(entry["model"])} for entry in config["models"]]
    return moved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=Path("runs"), help="training output with base/ and <task>/")
    parser.add_argument("--configs", nargs="+", type=Path, default=CONFIGS, help="merge configs to tune")
    parser.add_argument("--grid", nargs="+", type=float, default=[0.1, 0.3, 0.5, 0.7, 1.0], help="λ values")
    parser.add_argument("--tasks", nargs="+", help="run folders to score (default: every one)")
    parser.add_argument("--max_eval_samples", type=int, default=500,
                        help="stratified validation subset per task (default 500)")
    parser.add_argument("--workdir", type=Path, default=Path("runs/tune_scale"))
    parser.add_argument("--lora-merge-cache", dest="lora_merge_cache", help="mergekit's LoRA merge cache")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    args = parser.parse_args()
    runs_dir = args.runs.resolve()
    runs = task_runs(runs_dir, args.tasks or discover_tasks(runs_dir))
    device = resolve_device(args.device)
    tokenizer = find_tokenizer([runs[0].adapter_dir, runs_dir / BASE_DIR])
    validation = {run.name: load_split(run, "validation", tokenizer, max_samples=args.max_eval_samples)
                  for run in runs}
    sizes = {name: len(data) for name, data in validation.items()}
    args.workdir.mkdir(parents=True, exist_ok=True)
    table: dict[str, dict[str, Any]] = {}
    for path in args.configs:
        config = at_runs(read_merge_config(path), runs_dir)
        method = path.stem
        table[method] = {"merge_method": config["merge_method"], "scores": {}}
        for lam in args.grid:
            merged = args.workdir / f"{method}_lambda{lam:g}"
            shutil.rmtree(merged, ignore_errors=True)
            merge_candidate(with_parameter(config, "lambda", lam), merged, args.lora_merge_cache, args.device)
            counts = correct_counts(merged, runs, validation, tokenizer, args.batch_size, device)
            per_task = {name: counts[name] / sizes[name] for name in sizes}
            mean = task_averaged_accuracy(counts, sizes)
            table[method]["scores"][f"{lam:g}"] = {"mean": mean, **per_task}
            shutil.rmtree(merged)
            print(f"{method:16} λ = {lam:<4g} mean validation accuracy {mean:.4f}"
                  f"  ({', '.join(f'{name} {value:.3f}' for name, value in per_task.items())})", flush=True)
        scores = table[method]["scores"]
        table[method]["best_lambda"] = float(max(scores, key=lambda lam: scores[lam]["mean"]))
    print(f"\n{'method':16} " + " ".join(f"λ={lam:<5g}" for lam in args.grid) + "  best λ")
    for method, row in table.items():
        print(f"{method:16} " + " ".join(f"{row['scores'][f'{lam:g}']['mean']:<7.4f}" for lam in args.grid)
              + f"  {row['best_lambda']:g}")
    summary = {"split": "validation", "max_eval_samples": args.max_eval_samples, "validation_sizes": sizes,
               "runs": str(runs_dir), "grid": args.grid, "methods": table}
    (args.workdir / "tune_scale.json").write_text(json.dumps(summary, indent=2))
    print(f"\nwrote {args.workdir / 'tune_scale.json'}")


if __name__ == "__main__":
    main()
