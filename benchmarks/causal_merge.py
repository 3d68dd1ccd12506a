"""The paper's question on SmolLM2: DP-SGD vs DP-Merging causal adapters of the same seed, merged by each method.

Adapters come from the causal_recipe study's report stage, which keeps them, at ε = 8: the chosen
candidate (:data:`TRAINERS` ``dp_sgd``, plain DP-SGD) and the same candidate with ``--variant dp_merging``
(DP-SAT + alignment, ``dp_merging``), on every task of ``--tasks``. Units, each stored as JSON under
``benchmarks/reports/causal_recipe/merge-units`` and skipped when stored (a killed run resumes):

- ``zero_shot``: the base on each task's evaluation rows (the floor);
- ``<trainer>-seed<s>-individual``: each task's adapter alone on its task;
- ``<trainer>-seed<s>-<method>``: the tasks' adapters merged by ``hf-dpmerge merge`` (stock mergekit semantics) on
  the method's packaged causal config (:data:`CONFIGS`; its parameters as stored, base and inputs replaced), scored
  on each task.

Every unit scores the same rows: each task's seeded stratified test subset of ``--max-eval-samples`` (``hf-dpmerge
evaluate``'s subset; the whole split when it is smaller), by verbaliser likelihood
(:func:`hf_dpmerge.analysis.causal_evaluation.task_score`). The report (``MERGE.md``) is rewritten from the stored
units by :func:`benchmarks.merging.comparison`, with the zero-shot base as the floor.

    python -m benchmarks.studies.causal_recipe --stage report --tasks election_tweets,bbc_news
    python -m benchmarks.studies.causal_recipe --stage report --tasks election_tweets,bbc_news --variant dp_merging
    python -m benchmarks.causal_merge --base runs/causal_recipe/runs_causal/base
"""

from __future__ import annotations

import gc
import json
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from hf_dpmerge.utils.io import write_text_atomic

from . import harness, merging
from .merging import comparison, comparison_parser, parse_comparison, run_merge

REPORT_DIR = harness.REPORTS / "causal_recipe"
CANDIDATE = "b1600_t12_lr1e-2"
TRAINERS = {"dp_sgd": CANDIDATE, "dp_merging": f"{CANDIDATE}+dp_merging"}
TASKS = ("election_tweets", "bbc_news")
EPSILON = 8.0
CONFIGS = {"task_arithmetic": "causal_task_arithmetic.yaml", "ties": "causal_ties.yaml", "dp_aware": "causal_dp.yaml",
           "cauchy_poe": "causal_cauchy_poe.yaml"}
ZERO_SHOT = "zero_shot"
INDIVIDUAL = "individual"


def kept_run(kept: Path, task: str, trainer: str, seed: int) -> Path:
    """A kept report unit's run folder (``adapter/`` inside)."""
    return kept / f"{task}-{TRAINERS[trainer]}-test-eps{EPSILON:g}-seed{seed}" / task  # the causal_recipe unit


def complete_seeds(kept: Path, tasks: list[str]) -> list[int]:
    """Seeds with both trainers' adapters kept on every task."""
    return merging.complete_seeds(kept, tasks, lambda t, tr, s: kept_run(kept, t, tr, s) / "adapter")


def unit_name(trainer: str, seed: int, what: str) -> str:
    return f"{trainer}-seed{seed}-{what}"


def merge_config(method: str, runs: Path, tasks: list[str]) -> dict:
    """``merge_configs/<CONFIGS[method]>`` with its base and inputs replaced by ``runs``' (parameters kept)."""
    from hf_dpmerge.merging.merge_config import lora_reference, mergekit_config

    template = yaml.safe_load((harness.REPO / "merge_configs" / CONFIGS[method]).read_text())
    return mergekit_config(template["merge_method"], runs / "base",
                           [lora_reference(runs / "base", runs / task / "adapter") for task in tasks],
                           parameters=template.get("parameters"))


def scores(runs: Path, tasks: list[str], max_eval_samples: int, model_dir: Path | None = None) -> dict:
    """Each task's accuracy and row count: of ``model_dir`` (a plain causal LM), or, when None, of the base with
    the task's own adapter (``runs/<task>/adapter``)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_dpmerge.analysis.causal_evaluation import task_score
    from hf_dpmerge.analysis.runs_layout import task_rows, task_runs

    tokenizer = AutoTokenizer.from_pretrained(runs / "base")
    shared = None if model_dir is None else AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    result = {}
    for run in task_runs(runs, tasks):
        model = shared or PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(runs / "base", dtype=torch.float32), run.adapter_dir)
        rows = task_rows(run, "test", max_samples=max_eval_samples)
        result[run.task] = {"accuracy": task_score(model.eval(), tokenizer, run.spec, rows, run.max_length,
                                                   answer_end=run.record.answer_end_trained),
                            "num_examples": len(rows)}
        del model
        gc.collect()
    return result


@contextmanager
def merged_by(method: str, runs: Path, tasks: list[str], cell: Path) -> Iterator[tuple[Path, dict | None]]:
    """The tasks' adapters merged by ``method``'s packaged causal config (:func:`merge_config`) into
    ``cell/merged/<method>``, with the merge's parameters; the merged model is deleted on exit."""
    config = merge_config(method, runs, tasks)
    merged = cell / "merged" / method
    run_merge(config, cell / f"{method}.yaml", merged, cell / "lora_cache")
    try:
        yield merged, config.get("parameters")
    finally:
        shutil.rmtree(merged, ignore_errors=True)


def run_unit(kept: Path, base: Path, tasks: list[str], trainer: str | None, seed: int, what: str, work_dir: Path,
             max_eval_samples: int, path: Path) -> dict:
    """Score one unit (``what``: ``individual`` or a merge method; the zero-shot base with ``trainer`` None),
    store it at ``path``."""
    start = time.perf_counter()
    cell = work_dir / (ZERO_SHOT if trainer is None else f"{trainer}-seed{seed}")
    holder = trainer or "dp_sgd"  # the zero-shot reads only base/ (and the adapters' records: split seed, length)
    runs = merging.stage_runs(cell / "runs_causal", base, {t: kept_run(kept, t, holder, seed) for t in tasks})
    result: dict = {"trainer": trainer, "seed": seed, "what": what, "tasks": tasks,
                    "max_eval_samples": max_eval_samples}
    if what in (ZERO_SHOT, INDIVIDUAL):
        result["scores"] = scores(runs, tasks, max_eval_samples, runs / "base" if what == ZERO_SHOT else None)
    else:
        with merged_by(what, runs, tasks, cell) as (merged, parameters):
            result |= {"merge_parameters": parameters, "scores": scores(runs, tasks, max_eval_samples, merged)}
    result["seconds"] = time.perf_counter() - start
    write_text_atomic(path, json.dumps(result, indent=1) + "\n")
    return result


def merge_units(stored: dict[str, dict]) -> tuple[list[dict], dict[tuple[str, int], float]]:
    """The stored units as :mod:`benchmarks.merging` reads them (a merge unit per trainer, seed and
    method with its seed's individual scores) and the floors (task, seed) → % (the zero-shot base, every seed)."""
    floor = stored.get(ZERO_SHOT)
    units, floors = [], {}
    for unit in stored.values():
        if unit["what"] in (ZERO_SHOT, INDIVIDUAL):
            continue
        individual = stored.get(unit_name(unit["trainer"], unit["seed"], INDIVIDUAL))
        if individual is None or floor is None:
            continue
        tasks = unit["tasks"]
        units.append({"trainer": unit["trainer"], "seed": unit["seed"], "method": unit["what"], "tasks": tasks,
                      "evaluation": {"tasks": {t: {"individual": individual["scores"][t]["accuracy"],
                                                   "merged": unit["scores"][t]["accuracy"]} for t in tasks}}})
        floors |= {(t, unit["seed"]): 100 * floor["scores"][t]["accuracy"] for t in tasks}
    return units, floors


def write_report(stored: dict[str, dict], path: Path) -> str:
    units, floors = merge_units(stored)
    counts = next(({t: s["num_examples"] for t, s in u["scores"].items()} for u in stored.values()), {})
    text = comparison(
        units, floors, title="Merging private SmolLM2 adapters: DP-SGD vs DP-Merging (ε = 8)",
        preamble=[f"Generated by `python -m benchmarks.causal_merge` from {len(stored)} stored units "
                  "(benchmarks/reports/causal_recipe/merge-units). Verbaliser-scoring accuracy %, each task's "
                  "seeded stratified test subset (" + ", ".join(f"{t}: {n} rows" for t, n in counts.items())
                  + "), task averages, means over seeds; the floor is the zero-shot base on the same rows."],
        floor_label="zero-shot",
        footer="Trainers: " + "; ".join(f"`{tr}` = causal recipe candidate `{c}`" for tr, c in TRAINERS.items())
               + " at ε = 8 (benchmarks/studies/causal_recipe.py). Merge parameters: merge_configs/causal_*.yaml as "
                 "stored (λ = 1, not tuned).")
    write_text_atomic(path, text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = comparison_parser(
        "python -m benchmarks.causal_merge", __doc__, kept=harness.REPO / "runs" / "causal_recipe" / "kept",
        kept_help="the causal_recipe study's kept adapters (<its work-dir>/kept)",
        base=harness.REPO / "runs_causal" / "base",
        base_help="the base the kept adapters trained on (the causal script's <runs_dir>/base)", tasks=TASKS,
        work_dir=harness.REPO / "runs_causal" / "merge-work", units_dir=REPORT_DIR / "merge-units",
        report=REPORT_DIR / "MERGE.md")
    parser.add_argument("--max-eval-samples", type=int, default=500,
                        help="each task's stratified test subset (hf-dpmerge evaluate's --max_eval_samples)")
    args, tasks, methods = parse_comparison(parser, argv)
    if not args.report_only:
        seeds = complete_seeds(args.kept, tasks)
        if not seeds:
            parser.error(f"--kept {args.kept}: no seed has both trainers' adapters on {', '.join(tasks)}")
        todo = [(None, seeds[0], ZERO_SHOT)] + [(tr, s, w) for s in seeds for tr in TRAINERS
                                                for w in (INDIVIDUAL, *methods)]
        for trainer, seed, what in todo:
            path = args.units_dir / f"{ZERO_SHOT if trainer is None else unit_name(trainer, seed, what)}.json"
            if not path.exists():
                print(f"[causal_merge] {path.stem}", file=sys.stderr, flush=True)
                run_unit(args.kept, args.base, tasks, trainer, seed, what, args.work_dir.resolve(),
                         args.max_eval_samples, path)
    stored = {p.stem: json.loads(p.read_text()) for p in sorted(args.units_dir.glob("*.json"))}
    print(write_report(stored, args.report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
