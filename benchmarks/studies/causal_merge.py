"""Merging private SmolLM2 adapters: what each merge keeps (NAI over seeds), and the paper's question, DP-SGD vs
DP-Merging adapters of the same seed, merged by each method.

The adapters are the causal_recipe study's kept report units (:data:`TRAINERS`): its chosen candidate at ε = 8
(``dp_sgd``, plain DP-SGD), the same with ``--variant dp_merging`` (DP-SAT + alignment) and ``dp_sgd``'s twin without
privacy (``non_private``, ε = inf), each on every seed that has it on every task of ``--tasks``. Units: ``zero_shot``
(the base, the floor), per trainer and seed ``individual`` (each adapter alone) and each merge (the packaged causal
configs, and the encoder's data-free configs as they are; ``hf-dpmerge merge``, timed with the LoRA cache built
first), all scored by verbaliser likelihood on each task's seeded stratified test subset of ``--max-eval-samples``.
Report ``benchmarks/reports/causal_merge/MERGE.md`` (``MERGE-<tasks>.md`` for other ``--tasks``): the paper's
question (:func:`benchmarks.merging.comparison`), then NAI per trainer (:func:`benchmarks.nai.tables`) with the
SmolLM2 targets; docs/causal-lm.md.

    python -m benchmarks.studies.causal_merge --base runs/causal_recipe/runs_causal/base
    python -m benchmarks.studies.causal_merge --tasks rotten_tomatoes,election_tweets,bbc_news
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.causal import DATA_FREE, add_kept_arguments, causal_parameters, kept_runs, merge_config, scores
from benchmarks.harness import Unit, listed
from benchmarks.markdown import table
from benchmarks.merging import METHODS, comparison, stage_runs, timed_merge, trainer_evidence
from benchmarks.nai import BASELINE, Scores, best_method, defined_mean, seeds_cell, tables, verdict
from benchmarks.nai import scores as nai_scores

CANDIDATE = "b1600_t12_lr1e-2"
"""The causal_recipe study's chosen candidate."""
TRAINERS = {"dp_sgd": (CANDIDATE, 8.0), "dp_merging": (f"{CANDIDATE}+dp_merging", 8.0),
            "non_private": (CANDIDATE, math.inf)}
"""Trainer → (causal_recipe candidate, ε) of its kept adapters; ``non_private`` is ``dp_sgd``'s twin."""
TWINS = {"dp_sgd": "non_private"}
EVIDENCE = "hf_dpmerge/merging/data/dp_merging_causal.json"
"""What ``hf-dpmerge recommend``'s trainer advice reads from this study (:meth:`CausalMerge.exports`)."""
MERGES = (*METHODS, *DATA_FREE)
TASKS = ("election_tweets", "bbc_news")
"""The default tasks: the paper's question as first stored; units of other ``--tasks`` carry them in their names."""
TARGET_NAI, TARGET_SEEDS = 0.70, 3
"""The SmolLM2 targets (rotten_tomatoes, election_tweets and bbc_news at ε = 8, three seeds): the best method keeps
NAI ≥ 70 % on average, with no task below task arithmetic."""
ZERO_SHOT, INDIVIDUAL = "zero_shot", "individual"


def suffix(tasks: list[str] | tuple[str, ...]) -> str:
    """What a unit's name adds for tasks other than :data:`TASKS`."""
    return "" if tuple(tasks) == TASKS else "-" + "+".join(tasks)


def merge_units(stored: list[dict[str, Any]]) -> tuple[list[dict], dict[tuple[str, int], float]]:
    """The stored units as :func:`benchmarks.merging.comparison` and :func:`benchmarks.nai.scores` read them (a merge
    unit per trainer, seed, method and tasks with its seed's individual scores, and its merge seconds where timed)
    and the floors (task, seed) → % (the zero-shot base, every seed)."""
    by = {u["name"]: u["settings"] | u["result"] for u in stored}
    units, floors = [], {}
    for unit in by.values():
        tasks = unit["tasks"]
        individual = by.get(f"{unit['trainer']}-seed{unit['seed']}-{INDIVIDUAL}{suffix(tasks)}")
        floor = by.get(ZERO_SHOT + suffix(tasks))
        if unit["what"] in (ZERO_SHOT, INDIVIDUAL) or individual is None or floor is None:
            continue
        units.append({"trainer": unit["trainer"], "seed": unit["seed"], "method": unit["what"], "tasks": tasks,
                      "evaluation": {"tasks": {t: {"individual": individual["scores"][t]["accuracy"],
                                                   "merged": unit["scores"][t]["accuracy"]} for t in tasks}},
                      **({"merge_seconds": unit["merge_seconds"]} if "merge_seconds" in unit else {})})
        floors |= {(t, unit["seed"]): 100 * floor["scores"][t]["accuracy"] for t in tasks}
    return units, floors


def targets(found: dict[str, Scores]) -> list[str]:
    """The SmolLM2 targets of a private trainer: the best method other than task arithmetic by mean NAI, and each
    task's merged accuracy against task arithmetic's on the seeds both merged (means over those seeds)."""
    best = best_method(found)
    nai_target, task_target = f"NAI ≥ {100 * TARGET_NAI:.0f} % on average", "no task below task arithmetic"
    if best is None:
        return ["### Targets", "", table(["target", "value", "verdict"], [[nai_target, "—", verdict(None)],
                                                                          [task_target, "—", verdict(None)]]), ""]
    chosen, baseline = found[best], found.get(BASELINE)
    mean_nai = defined_mean(chosen.nai)
    seeds = chosen.common(baseline) if baseline else []

    def task_mean(s: Scores, task: str) -> float:
        return statistics.mean(s.task_merged[task][s.seeds.index(seed)] for seed in seeds)

    below = [t for t in chosen.task_merged if seeds and task_mean(chosen, t) < task_mean(baseline, t)]
    rows = [[nai_target, f"`{best}` {100 * mean_nai:.0f} % on seeds {seeds_cell(chosen.seeds)}",
             verdict(mean_nai >= TARGET_NAI)],
            [task_target, "—" if not seeds else f"`{best}` below on {', '.join(below)}" if below
             else f"`{best}` on no task, seeds {seeds_cell(seeds)}", verdict(None if not seeds else not below)]]
    return ["### Targets", "",
            f"On {len(chosen.seeds)} seed(s) and {len(chosen.task_nai)} task(s) (the targets ask {TARGET_SEEDS} seeds "
            "and rotten_tomatoes, election_tweets, bbc_news at ε = 8). The best method: the highest mean NAI other "
            "than task arithmetic's.", "", table(["target", "value", "verdict"], rows), ""]


def gain_sections(units: list[dict], floors: dict[tuple[str, int], float]) -> list[str]:
    """Per trainer, what each merge keeps (:func:`benchmarks.nai.tables`); a private trainer's with the drop against
    its non-private twin (:data:`TWINS`) and the targets."""
    found: dict[str, dict[str, Scores]] = {}
    for trainer in TRAINERS:
        ours = [u for u in units if u["trainer"] == trainer]
        found[trainer] = {m: score for m in MERGES
                          if (score := nai_scores([u for u in ours if u["method"] == m], floors)).seeds}
    text = []
    for trainer, (candidate, epsilon) in TRAINERS.items():
        if not found[trainer]:
            continue
        note = (f"Floor: the zero-shot base on the same rows; `{trainer}` = causal recipe candidate `{candidate}` "
                + ("without DP." if math.isinf(epsilon) else f"at ε = {epsilon:g}.")
                + " Verbaliser-scoring accuracy %.")
        text += [f"## What merges keep: `{trainer}`", ""]
        if trainer in TWINS:
            text += tables(found[trainer], note, TWINS[trainer], found[TWINS[trainer]]) + targets(found[trainer])
        else:
            text += tables(found[trainer], note)
    return text


class CausalMerge(harness.Study, name="causal_merge", schema=1):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_kept_arguments(parser)
        parser.add_argument("--tasks", default=",".join(TASKS))
        parser.add_argument("--methods", default=",".join(MERGES), help="a subset of the merges")
        parser.add_argument("--max-eval-samples", type=int, default=500,
                            help="each task's stratified test subset (hf-dpmerge evaluate's --max_eval_samples)")

    def plan(self, args: argparse.Namespace) -> list[Unit]:
        """Per trainer, every seed whose adapters it kept on every task; the zero-shot base once."""
        tasks, methods = args.tasks.split(","), listed(args.methods, MERGES, "--methods")
        self.base = args.base.resolve()
        self.kept = kept_runs(args.kept.resolve())
        seeds = {trainer: sorted({seed for (_, c, e, seed) in self.kept if (c, e) == key
                                  and all((t, c, e, seed) in self.kept for t in tasks)})
                 for trainer, key in TRAINERS.items()}
        if not seeds["dp_sgd"]:
            raise ValueError(f"--kept {args.kept}: no seed has dp_sgd's adapters on {', '.join(tasks)}")
        common = {"tasks": tasks, "max_eval_samples": args.max_eval_samples}
        return [Unit(ZERO_SHOT + suffix(tasks), {"what": ZERO_SHOT, "trainer": None, "seed": seeds["dp_sgd"][0],
                                                 **common}),
                *(Unit(f"{trainer}-seed{seed}-{what}{suffix(tasks)}",
                       {"what": what, "trainer": trainer, "seed": seed, **common}
                       | ({} if what == INDIVIDUAL else {"merge_parameters": causal_parameters(what)}))
                  for trainer in TRAINERS for seed in seeds[trainer] for what in (INDIVIDUAL, *methods))]

    def run(self, unit: Unit, work_dir: Path) -> dict[str, Any]:
        """Score the zero-shot base, each adapter alone, or the tasks' adapters merged by one method (timed)."""
        s = unit.settings
        cell = work_dir / ((ZERO_SHOT if s["trainer"] is None else f"{s['trainer']}-seed{s['seed']}")
                           + suffix(s["tasks"]).replace("+", "-"))  # no "+" in a path: mergekit reads base+adapter
        candidate, epsilon = TRAINERS[s["trainer"] or "dp_sgd"]  # the zero-shot reads only base/ (and split seeds)
        runs = stage_runs(cell / "runs_causal", self.base,
                          {t: self.kept[(t, candidate, epsilon, s["seed"])] for t in s["tasks"]})
        if s["what"] in (ZERO_SHOT, INDIVIDUAL):
            return {"scores": scores(runs, s["tasks"], s["max_eval_samples"],
                                     runs / "base" if s["what"] == ZERO_SHOT else None)}
        merged = cell / "merged" / s["what"]
        seconds = timed_merge(merge_config(s["what"], runs, s["tasks"], s["merge_parameters"]),
                              cell / f"{s['what']}.yaml", merged, cell / "lora_cache")
        try:
            return {"scores": scores(runs, s["tasks"], s["max_eval_samples"], merged), "merge_seconds": seconds}
        finally:
            shutil.rmtree(merged, ignore_errors=True)

    def report(self, stored: list[dict[str, Any]]) -> dict[str, str]:
        """One file per task set: the paper's question, then what each merge keeps per trainer."""
        units, floors = merge_units(stored)
        files = {}
        for tasks in dict.fromkeys(tuple(u["tasks"]) for u in units):
            group = [u for u in units if tuple(u["tasks"]) == tasks]
            counts = next(({t: s["num_examples"] for t, s in u["result"]["scores"].items()} for u in stored
                           if tuple(u["settings"]["tasks"]) == tasks), {})
            files[f"MERGE{suffix(tasks)}.md"] = comparison(
                group, floors, title=f"Merging private SmolLM2 adapters on {', '.join(tasks)}: DP-SGD vs DP-Merging "
                                     "(ε = 8), and what each merge keeps",
                preamble=[f"Generated by `python -m benchmarks.studies.causal_merge --report-only` from {len(stored)} "
                          "stored units. Verbaliser-scoring accuracy %, each task's seeded stratified test subset ("
                          + ", ".join(f"{t}: {n} rows" for t, n in counts.items())
                          + "), task averages, means over seeds; the floor is the zero-shot base on the same rows. "
                            "NAI = (merged − zero-shot) / (individual − zero-shot), 95 % t intervals over seeds."],
                floor_label="zero-shot",
                footer="Trainers: " + "; ".join(f"`{tr}` = causal recipe candidate `{c}` at ε = {e:g}"
                                                for tr, (c, e) in TRAINERS.items())
                       + " (benchmarks/studies/causal_recipe.py). Merge parameters: merge_configs/causal_*.yaml, and "
                         "the encoder's data-free configs (tsv.yaml, …), as stored (λ = 1, not tuned).") \
                + "\n".join(["", *gain_sections(group, floors)])
        return files or {"MERGE.md": "# Merging private SmolLM2 adapters\n\nNo merge unit is stored yet.\n"}

    def exports(self, stored: list[dict[str, Any]]) -> dict[str, str]:
        """``hf-dpmerge recommend``'s evidence on the trainer: the paper's question on each task set."""
        units, floors = merge_units(stored)
        task_sets = dict.fromkeys(tuple(u["tasks"]) for u in units)
        return {EVIDENCE: json.dumps({
            "testbed": f"SmolLM2-135M, the causal recipe `{CANDIDATE}` against `{TRAINERS['dp_merging'][0]}`",
            "floor": "the zero-shot base",
            "comparisons": [{"report": f"benchmarks/reports/causal_merge/MERGE{suffix(tasks)}.md", "epsilon": 8.0,
                             **trainer_evidence([u for u in units if tuple(u["tasks"]) == tasks], floors)}
                            for tasks in task_sets]}, indent=1, ensure_ascii=False) + "\n"}


if __name__ == "__main__":
    sys.exit(harness.main(CausalMerge()))
