"""Ending the answer: do merged SmolLM2 adapters answer through stock generation once they never learnt to end it,
or once a public anchor holds their answers elsewhere at the base's? (docs/causal-lm.md)

Every merge of the causal_merge study's seed-0 DP-SGD pair answered with an empty string: its first greedy token is
the end of the turn. This scores the causal_recipe study's kept pairs trained with a variant (:data:`VARIANTS`:
``no_answer_end``, ``--train_answer_end false``; ``public_anchor``, ``--anchor_lambda 1``) on the rows causal_merge
scores: per seed the zero-shot base (when the variant leaves the end out: the floor scored its way), each adapter
alone, each merge method and, where kept, each non-private twin alone; verbaliser scoring as ``hf-dpmerge evaluate``
scores these adapters, and stock ``pipeline("text-generation")`` answers. Report
``benchmarks/reports/answer_end/ANSWER_END.md``, beside the learnt pair's stored units.

    python -m benchmarks.studies.answer_end --variant no_answer_end
    python -m benchmarks.studies.answer_end --variant public_anchor
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.causal import (
    GENERATION_SAMPLES,
    add_kept_arguments,
    causal_parameters,
    kept_runs,
    merged_by,
    merged_generation,
    score_kept_generation,
    scores,
)
from benchmarks.harness import Unit, listed
from benchmarks.markdown import table
from benchmarks.merging import METHODS, stage_runs

CANDIDATE, TASKS, EPSILON = "b1600_t12_lr1e-2", ("election_tweets", "bbc_news"), 8.0
"""The causal_recipe study's chosen candidate, and the causal_merge study's tasks and ε."""
VARIANTS = {"no_answer_end": "left out", "public_anchor": "learnt, anchored"}
"""The causal_recipe variants this compares with the pair that learnt the answer's end, and how the report names
each one's answer's end."""
LEFT_OUT = "no_answer_end"
"""The variant whose adapters never learnt the answer's end (``--train_answer_end false``): scored without it,
against a zero-shot floor of its own; a variant that learnt it has the learnt pair's floor."""
ZERO_SHOT, INDIVIDUAL, NON_PRIVATE = "zero_shot", "individual", "non_private"
LEARNT_GENERATION = {"task_arithmetic": "generation_task_arithmetic.json", "ties": "generation_ties.json",
                     "dp_aware": "generation_dp.json", "cauchy_poe": "generation_cauchy_poe.json"}
"""Each seed-0 DP-SGD merge's stock generation (:func:`benchmarks.causal.merged_generation`), in
``benchmarks/reports/causal_recipe/``."""


def _learnt(what: str, seed: int) -> tuple[dict | None, dict | None]:
    """The stored verbaliser scores (the end scored) and generation of the seed's DP-SGD pair that learnt the
    answer's end."""
    name = ZERO_SHOT if what == ZERO_SHOT else f"dp_sgd-seed{seed}-{what}"
    learnt = next((u["result"]["scores"] for u in harness.stored("causal_merge", 1) if u["name"] == name), None)
    if what == ZERO_SHOT:
        produced = None
    elif what == INDIVIDUAL:
        names = [f"generation-{t}-{CANDIDATE}-test-eps{EPSILON:g}-seed{seed}"
                 for t in TASKS]
        produced = {u["settings"]["task"]: u["result"] for u in harness.stored("causal_recipe", 1)
                    if u["name"] in names}
    else:
        file = harness.REPORTS / "causal_recipe" / LEARNT_GENERATION[what]
        produced = json.loads(file.read_text()) if seed == 0 and file.exists() else None
    return learnt, (produced or None)


def _accuracy(scores: dict | None, task: str) -> float | None:
    return None if scores is None or task not in scores else 100 * scores[task]["accuracy"]


def _share(accuracy: float | None, floor: float | None, reference: float | None) -> str:
    """(accuracy − floor) / (reference − floor), or — (undefined when the reference does not beat the floor)."""
    if accuracy is None or floor is None or reference is None or reference <= floor:
        return "—"
    return f"{(accuracy - floor) / (reference - floor):.0%}"


def _cells(accuracy: float | None, floor: float | None, individual: float | None, non_private: float | None,
           produced: dict | None, task: str) -> list[str]:
    """Accuracy, its gain over the zero-shot base scored the same way, the share of the non-private adapter's gain
    (an adapter alone), the share of the adapter's own gain kept (a merge), and the generation shares."""
    row = (produced or {}).get(task) or {}
    shares = [f"{100 * row[key]:.0f}" if key in row else "—" for key in (
        "end_of_sequence_first", "generation_is_a_verbaliser", "generation_begins_with_a_verbaliser",
        "generation_begins_with_gold")]
    return ["—" if accuracy is None else f"{accuracy:.1f}",
            "—" if accuracy is None or floor is None else f"{accuracy - floor:+.1f}",
            _share(accuracy, floor, non_private), _share(accuracy, floor, individual), *shares]


def answer_end_report(units: list[dict]) -> str:
    """``ANSWER_END.md``: each stored unit's rows beside the learnt-end pair's, each against the zero-shot base
    scored as the pair is scored (the end included for a pair that learnt it, the verbaliser alone for the other)."""
    stored = {(u["variant"], u["seed"], u["what"]): u for u in units}
    order = (ZERO_SHOT, INDIVIDUAL, NON_PRIVATE)
    rows = []
    first = {}  # the learnt pair's rows go once, beside the first variant's unit of each seed and model
    for unit in sorted(units, key=lambda u: list(VARIANTS).index(u["variant"])):
        first.setdefault((unit["seed"], unit["what"]), unit["variant"])
    for unit in sorted(units, key=lambda u: (u["seed"], order.index(u["what"]) if u["what"] in order else 3,
                                             u["what"], list(VARIANTS).index(u["variant"]))):
        variant, seed, what = unit["variant"], unit["seed"], unit["what"]
        scoring = "with the end" if all(unit["answer_end_scored"].values()) else "verbaliser alone"
        floor_unit, individual_unit = stored.get((variant, seed, ZERO_SHOT)), stored.get((variant, seed, INDIVIDUAL))
        private_unit = stored.get((variant, seed, NON_PRIVATE))
        floor = floor_unit and floor_unit["scores"]
        if floor_unit is None and scoring == "with the end":  # scored as the learnt pair: its zero-shot floor
            floor = _learnt(ZERO_SHOT, seed)[0]
        arms = [(VARIANTS[variant], scoring, unit["scores"], unit.get("generation"), floor,
                 individual_unit and individual_unit["scores"], private_unit and private_unit["scores"])]
        if what != NON_PRIVATE and first[(seed, what)] == variant:  # the learnt pair: no non-private twin here
            learnt_scores, learnt_generation = _learnt(what, seed)
            arms.insert(0, ("learnt (stored)", "with the end", learnt_scores, learnt_generation,
                            _learnt(ZERO_SHOT, seed)[0], _learnt(INDIVIDUAL, seed)[0], None))
        for task in unit["tasks"]:
            for label, scoring, arm_scores, produced, floor, individual, non_private in arms:
                rows.append([what, str(seed), task, label, scoring, *_cells(
                    _accuracy(arm_scores, task), _accuracy(floor, task),
                    _accuracy(individual, task) if what not in order else None,
                    _accuracy(non_private, task) if what == INDIVIDUAL else None, produced, task)])
    text = ["# Ending the answer: merged SmolLM2 adapters through stock generation", "",
            f"Generated by `python -m benchmarks.studies.answer_end --report-only` from {len(units)} stored units "
            "(protocol: the module docstring). The adapters: the causal recipe's chosen candidate "
            f"(`{CANDIDATE}`, plain DP-SGD, ε = 8) with the answer's end learnt (stored units of "
            "the causal_merge study), left out of the loss (`--train_answer_end false`), or learnt with the "
            "public anchor (`--anchor_lambda 1`: KL to the base's answers on the packaged public prompts, after the "
            "noise; docs/design.md §14.1). Merges: the packaged "
            "causal configs, λ = 1. Accuracy: verbaliser scoring on each task's stratified test subset, %, as "
            "`hf-dpmerge evaluate` scores each pair: every response token, the end of sequence included, for the "
            "pair that learnt it; the verbaliser's tokens alone for the pair that did not. Gain: over the zero-shot "
            "base scored the same way; of the non-private gain: an adapter's gain over its non-private twin's "
            "(same recipe, `--epsilon inf`, kept by the report stage); kept: a merge's gain over the adapter's own. "
            f"Generation: greedy stock `pipeline(\"text-generation\")` on {GENERATION_SAMPLES} stratified test "
            "examples per task, % of answers; \"begins with\" counts an answer that goes on after a whole-word "
            "verbaliser (\"Trump.\").", "",
            table(["model", "seed", "task", "answer's end", "scoring", "accuracy", "gain",
                            "of the non-private gain", "gain kept",
                            "end of sequence first", "answer is a verbaliser", "begins with a verbaliser",
                            "begins with the gold one"], rows),
            ""]
    return "\n".join(text)


class AnswerEnd(harness.Study, name="answer_end", schema=1):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--variant", choices=sorted(VARIANTS), default="no_answer_end",
                            help="the causal_recipe variant whose kept pair is scored")
        add_kept_arguments(parser)
        parser.add_argument("--tasks", default=",".join(TASKS))
        parser.add_argument("--seeds", default="0")
        parser.add_argument("--methods", default=",".join(METHODS), help="a subset of the merge methods")
        parser.add_argument("--max-eval-samples", type=int, default=500,
                            help="each task's stratified test subset (as the causal_merge study scores it)")

    def plan(self, args: argparse.Namespace) -> list[Unit]:
        """Per seed: the zero-shot base (a variant that leaves the end out), each adapter alone, each merge and the
        non-private twins kept; the kept runs read from the causal_recipe study's stored units."""
        tasks, methods = args.tasks.split(","), listed(args.methods, METHODS, "--methods")
        candidate = f"{CANDIDATE}+{args.variant}"
        self.base = args.base.resolve()
        self.kept = {(t, e, s): run for (t, c, e, s), run in kept_runs(args.kept.resolve()).items() if c == candidate}
        units = []
        for seed in map(int, args.seeds.split(",")):
            if missing := [t for t in tasks if (t, EPSILON, seed) not in self.kept]:
                raise ValueError(f"--kept {args.kept}: no kept {args.variant} adapter of seed {seed} on {missing}")
            private = [t for t in tasks if (t, math.inf, seed) in self.kept]
            floor = (ZERO_SHOT,) if args.variant == LEFT_OUT else ()
            for what, unit_tasks in [(what, tasks) for what in (*floor, INDIVIDUAL, *methods)] + (
                    [(NON_PRIVATE, private)] if private else []):
                settings = {"variant": args.variant, "seed": seed, "what": what, "tasks": unit_tasks,
                            "max_eval_samples": args.max_eval_samples}
                if what in METHODS:
                    settings["merge_parameters"] = causal_parameters(what)
                units.append(Unit(f"{args.variant}-seed{seed}-{what}", settings))
        return units

    def run(self, unit: Unit, work_dir: Path) -> dict[str, Any]:
        """Score one unit by verbaliser likelihood and, for ``individual`` and the merges, stock generation."""
        from hf_dpmerge.analysis.task_run import task_runs

        s = unit.settings
        cell = work_dir / f"{s['variant']}-seed{s['seed']}"
        epsilon = math.inf if s["what"] == NON_PRIVATE else EPSILON
        kept = {t: self.kept[(t, epsilon, s["seed"])] for t in s["tasks"]}
        runs = stage_runs(cell / ("runs_nonprivate" if s["what"] == NON_PRIVATE else "runs_causal"), self.base, kept)
        tasks, samples = s["tasks"], s["max_eval_samples"]
        result: dict = {"answer_end_scored": {r.task: r.record.answer_end_trained for r in task_runs(runs, tasks)}}
        if s["what"] == ZERO_SHOT:
            result["scores"] = scores(runs, tasks, samples, runs / "base")
        elif s["what"] in (INDIVIDUAL, NON_PRIVATE):
            result["scores"] = scores(runs, tasks, samples)
            if s["what"] == INDIVIDUAL:  # each adapter alone as the recipe study's generation stage asks it
                result["generation"] = {t: score_kept_generation(cell, kept[t].parent) for t in tasks}
        else:
            with merged_by(s["what"], runs, tasks, cell, s["merge_parameters"]) as merged:
                result["scores"] = scores(runs, tasks, samples, merged)
                result["generation"] = merged_generation(merged, runs, tasks)
        return result

    def report(self, stored: list[dict[str, Any]]) -> dict[str, str]:
        return {"ANSWER_END.md": answer_end_report([u["settings"] | u["result"] for u in stored])}


if __name__ == "__main__":
    sys.exit(harness.main(AnswerEnd()))
