"""The paper's question on SmolLM2: DP-SGD vs DP-Merging causal adapters of the same seed, merged by each method.

The adapters are the causal_recipe study's kept report units at ε = 8: its chosen candidate (``dp_sgd``, plain
DP-SGD) and the same with ``--variant dp_merging`` (DP-SAT + alignment), for every seed with both on every task of
``--tasks``. Units: ``zero_shot`` (the base, the floor), per trainer and seed ``individual`` (each adapter alone)
and each merge method (its packaged causal config, ``hf-dpmerge merge``), all scored by verbaliser likelihood on
each task's seeded stratified test subset of ``--max-eval-samples``. Report
``benchmarks/reports/causal_merge/MERGE.md`` (:func:`benchmarks.merging.comparison`); docs/causal-lm.md.

    python -m benchmarks.studies.causal_merge --base runs/causal_recipe/runs_causal/base
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.causal import add_kept_arguments, causal_parameters, kept_runs, merged_by, scores
from benchmarks.harness import Unit, listed
from benchmarks.merging import METHODS, comparison, stage_runs

CANDIDATE = "b1600_t12_lr1e-2"
"""The causal_recipe study's chosen candidate."""
TRAINERS = {"dp_sgd": CANDIDATE, "dp_merging": f"{CANDIDATE}+dp_merging"}
TASKS = ("election_tweets", "bbc_news")
EPSILON = 8.0
ZERO_SHOT, INDIVIDUAL = "zero_shot", "individual"


def merge_units(stored: list[dict[str, Any]]) -> tuple[list[dict], dict[tuple[str, int], float]]:
    """The stored units as :func:`benchmarks.merging.comparison` reads them (a merge unit per trainer, seed and
    method with its seed's individual scores) and the floors (task, seed) → % (the zero-shot base, every seed)."""
    by = {u["name"]: u["settings"] | u["result"] for u in stored}
    floor, units, floors = by.get(ZERO_SHOT), [], {}
    for unit in by.values():
        individual = by.get(f"{unit['trainer']}-seed{unit['seed']}-{INDIVIDUAL}")
        if unit["what"] in (ZERO_SHOT, INDIVIDUAL) or individual is None or floor is None:
            continue
        tasks = unit["tasks"]
        units.append({"trainer": unit["trainer"], "seed": unit["seed"], "method": unit["what"], "tasks": tasks,
                      "evaluation": {"tasks": {t: {"individual": individual["scores"][t]["accuracy"],
                                                   "merged": unit["scores"][t]["accuracy"]} for t in tasks}}})
        floors |= {(t, unit["seed"]): 100 * floor["scores"][t]["accuracy"] for t in tasks}
    return units, floors


class CausalMerge(harness.Study, name="causal_merge", schema=1):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_kept_arguments(parser)
        parser.add_argument("--tasks", default=",".join(TASKS))
        parser.add_argument("--methods", default=",".join(METHODS), help="a subset of the merge methods")
        parser.add_argument("--max-eval-samples", type=int, default=500,
                            help="each task's stratified test subset (hf-dpmerge evaluate's --max_eval_samples)")

    def plan(self, args: argparse.Namespace) -> list[Unit]:
        tasks, methods = args.tasks.split(","), listed(args.methods, METHODS, "--methods")
        self.base = args.base.resolve()
        self.kept = {(t, c, s): run for (t, c, e, s), run in kept_runs(args.kept.resolve()).items() if e == EPSILON}
        seeds = sorted({seed for (_, _, seed) in self.kept
                        if all((t, c, seed) in self.kept for t in tasks for c in TRAINERS.values())})
        if not seeds:
            raise ValueError(f"--kept {args.kept}: no seed has both trainers' adapters on {', '.join(tasks)}")
        common = {"tasks": tasks, "max_eval_samples": args.max_eval_samples}
        return [Unit(ZERO_SHOT, {"what": ZERO_SHOT, "trainer": None, "seed": seeds[0], **common}),
                *(Unit(f"{trainer}-seed{seed}-{what}",
                       {"what": what, "trainer": trainer, "seed": seed, **common}
                       | ({} if what == INDIVIDUAL else {"merge_parameters": causal_parameters(what)}))
                  for seed in seeds for trainer in TRAINERS for what in (INDIVIDUAL, *methods))]

    def run(self, unit: Unit, work_dir: Path) -> dict[str, Any]:
        """Score the zero-shot base, each adapter alone, or the tasks' adapters merged by one method."""
        s = unit.settings
        cell = work_dir / (ZERO_SHOT if s["trainer"] is None else f"{s['trainer']}-seed{s['seed']}")
        holder = TRAINERS[s["trainer"] or "dp_sgd"]  # the zero-shot reads only base/ (and the records' split seed)
        runs = stage_runs(cell / "runs_causal", self.base, {t: self.kept[(t, holder, s["seed"])] for t in s["tasks"]})
        if s["what"] in (ZERO_SHOT, INDIVIDUAL):
            return {"scores": scores(runs, s["tasks"], s["max_eval_samples"],
                                     runs / "base" if s["what"] == ZERO_SHOT else None)}
        with merged_by(s["what"], runs, s["tasks"], cell, s["merge_parameters"]) as merged:
            return {"scores": scores(runs, s["tasks"], s["max_eval_samples"], merged)}

    def report(self, stored: list[dict[str, Any]]) -> dict[str, str]:
        units, floors = merge_units(stored)
        counts = next(({t: s["num_examples"] for t, s in u["result"]["scores"].items()} for u in stored), {})
        return {"MERGE.md": comparison(
            units, floors, title="Merging private SmolLM2 adapters: DP-SGD vs DP-Merging (ε = 8)",
            preamble=[f"Generated by `python -m benchmarks.studies.causal_merge --report-only` from {len(stored)} "
                      "stored units. Verbaliser-scoring accuracy %, each task's seeded stratified test subset ("
                      + ", ".join(f"{t}: {n} rows" for t, n in counts.items())
                      + "), task averages, means over seeds; the floor is the zero-shot base on the same rows."],
            floor_label="zero-shot",
            footer="Trainers: " + "; ".join(f"`{tr}` = causal recipe candidate `{c}`" for tr, c in TRAINERS.items())
                   + " at ε = 8 (benchmarks/studies/causal_recipe.py). Merge parameters: merge_configs/causal_*.yaml "
                     "as stored (λ = 1, not tuned).")}


if __name__ == "__main__":
    sys.exit(harness.main(CausalMerge()))
