"""Ending the answer: do merged SmolLM2 adapters answer through stock generation once they never learnt to end it,
or once a public anchor holds their answers elsewhere at the base's?

Every merge of the seed-0 DP-SGD pair (``benchmarks.causal_merge``) answered with an empty string: its first greedy
token is the end of the turn, which each adapter learnt to put after its verbaliser and pushes, outside its own
task, at the answer's first position too (docs/causal-lm.md). This trains the same pair with that token left out
of the loss (``benchmarks.studies.causal_recipe --variant no_answer_end``: ``--train_answer_end false``, nothing else
changed) and scores, per unit, on the rows ``benchmarks.causal_merge`` scores (each task's seeded stratified test
subset of ``--max-eval-samples``):

- verbaliser-scoring accuracy (:func:`benchmarks.causal.scores`) as ``hf-dpmerge evaluate`` scores these
  adapters: their records say ``train_answer_end`` false, so the verbaliser's tokens alone, the end they never
  learnt left out;
- stock ``pipeline("text-generation")`` answers on :data:`~benchmarks.causal.GENERATION_SAMPLES` stratified
  test examples (:func:`benchmarks.causal.generation_scores`).

``--variant public_anchor`` asks the second question of the pair trained with the public anchor instead
(the causal_recipe study's ``--variant public_anchor``: ``--anchor_lambda 1``, the answer's end learnt;
docs/design.md §14.1): its adapters are scored with the end, as the learnt pair's stored units are, whose
zero-shot unit is then the floor.

Units: ``zero_shot`` (the base, scored the same way: the floor of this scoring; not run for a variant that learnt
the end), ``individual`` (each adapter alone
on its task, stock ``peft`` ``merge_and_unload``), one per merge method (the packaged causal config, λ = 1, as
``benchmarks.causal_merge`` merges it) and, where the variant's non-private adapters are kept (the report stage
with ``--epsilon inf``), ``non_private`` (each alone on its task, verbaliser scoring only: the DP adapter's share of
its gain). Stored as JSON under
``benchmarks/reports/causal_recipe/answer-end/units`` (a killed run resumes); ``ANSWER_END.md`` sets them beside the
stored units of the pair that learnt the answer's end (``merge-units/dp_sgd-seed<s>-*``, ``generation_*.json``).

    python -m benchmarks.studies.causal_recipe --stage report --tasks bbc_news,election_tweets --variant no_answer_end
    python -m benchmarks.studies.causal_recipe --stage report --tasks bbc_news --variant no_answer_end --epsilon inf
    python -m benchmarks.answer_end --kept runs/causal_recipe/kept --base runs/causal_recipe/runs_causal/base
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from pathlib import Path

from hf_dpmerge.analysis.runs_layout import task_runs
from hf_dpmerge.utils.io import write_text_atomic

from . import harness, merging
from .causal import GENERATION_SAMPLES, causal_parameters, generation_scores, merged_by, score_kept_generation, scores
from .markdown import table as markdown_table
from .studies import causal_merge
from .studies.causal_recipe import VARIANTS as RECIPE_VARIANTS

REPORT_DIR = harness.REPORTS / "causal_recipe" / "answer-end"
VARIANTS = {"no_answer_end": "left out", "public_anchor": "learnt, anchored"}
"""The ``benchmarks.causal_recipe`` variants this compares with the pair that learnt the answer's end, and how the
report names each one's answer's end."""
INDIVIDUAL = causal_merge.INDIVIDUAL
ZERO_SHOT = causal_merge.ZERO_SHOT
NON_PRIVATE = "non_private"
# what the pair that learnt the answer's end stored: each merge's stock generation (benchmarks.causal_runs
# --score_generation of the seed-0 DP-SGD merges) and each adapter alone (benchmarks.causal_recipe --stage generation)
LEARNT_GENERATION = {"task_arithmetic": "generation_task_arithmetic.json", "ties": "generation_ties.json",
                     "dp_aware": "generation_dp.json", "cauchy_poe": "generation_cauchy_poe.json"}


def kept_run(kept: Path, task: str, seed: int, epsilon: float = causal_merge.EPSILON,
             variant: str = "no_answer_end") -> Path:
    """The kept run folder of ``task`` trained with ``variant`` (``adapter/`` inside; ε = inf: its non-private
    twin)."""
    return kept / f"{task}-{causal_merge.CANDIDATE}+{variant}-test-eps{epsilon:g}-seed{seed}" / task


def generation(model, runs: Path, tasks: list[str]) -> dict:
    """:func:`generation_scores` of the merged ``model`` on each task (the tokenizer and ``max_length`` of its
    run)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(runs / "base")
    return {run.task: generation_scores(model, tokenizer, run.task, run.max_length, GENERATION_SAMPLES,
                                        run.record.answer_end_trained) for run in task_runs(runs, tasks)}


def run_unit(kept: Path, base: Path, tasks: list[str], seed: int, what: str, work_dir: Path, max_eval_samples: int,
             path: Path, variant: str = "no_answer_end") -> dict:
    """Score one unit of ``variant``'s pair (``what``: ``zero_shot``, ``individual``, ``non_private`` or a merge
    method) by verbaliser likelihood and, for ``individual`` and the merges, stock generation; store it at
    ``path``."""
    import torch
    from transformers import AutoModelForCausalLM

    start = time.perf_counter()
    cell = work_dir / f"{variant}-seed{seed}"
    epsilon = math.inf if what == NON_PRIVATE else causal_merge.EPSILON
    runs = merging.stage_runs(cell / ("runs_nonprivate" if what == NON_PRIVATE else "runs_causal"), base,
                                       {t: kept_run(kept, t, seed, epsilon, variant) for t in tasks})
    result: dict = {"variant": variant, "seed": seed, "what": what, "tasks": tasks,
                    "max_eval_samples": max_eval_samples,
                    "answer_end_scored": {run.task: run.record.answer_end_trained for run in task_runs(runs, tasks)}}
    if what == ZERO_SHOT:
        result["scores"] = scores(runs, tasks, max_eval_samples, runs / "base")
    elif what in (INDIVIDUAL, NON_PRIVATE):
        result["scores"] = scores(runs, tasks, max_eval_samples)
        if what == INDIVIDUAL:  # each adapter alone as the recipe benchmark's generation stage asks it (stock peft)
            result["generation"] = {t: score_kept_generation(
                cell, kept_run(kept, t, seed, variant=variant).parent) for t in tasks}
    else:
        with merged_by(what, runs, tasks, cell, causal_parameters(what)) as merged:
            result |= {"merge_parameters": causal_parameters(what),
                       "scores": scores(runs, tasks, max_eval_samples, merged)}
            model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
            result["generation"] = generation(model, runs, tasks)
            del model
            gc.collect()
    result["seconds"] = time.perf_counter() - start
    write_text_atomic(path, json.dumps(result, indent=1) + "\n")
    return result


def _learnt(what: str, seed: int) -> tuple[dict | None, dict | None]:
    """The stored verbaliser scores (the end scored) and generation of the seed's DP-SGD pair that learnt the
    answer's end."""
    name = ZERO_SHOT if what == ZERO_SHOT else f"dp_sgd-seed{seed}-{what}"
    learnt = next((u["result"]["scores"] for u in harness.stored("causal_merge", 1) if u["name"] == name), None)
    if what == ZERO_SHOT:
        produced = None
    elif what == INDIVIDUAL:
        names = [f"generation-{t}-{causal_merge.CANDIDATE}-test-eps{causal_merge.EPSILON:g}-seed{seed}"
                 for t in causal_merge.TASKS]
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


def _variant(unit: dict) -> str:
    return unit.get("variant", "no_answer_end")  # units stored before the public anchor were all no_answer_end


def learns_the_end(variant: str) -> bool:
    """Whether ``variant``'s flags keep the answer's end in the loss (``hf-dpmerge evaluate`` then scores it)."""
    flags = RECIPE_VARIANTS[variant]
    return not any(a == "--train_answer_end" and b == "false" for a, b in zip(flags, flags[1:]))


def _scoring(unit: dict) -> str:
    ended = unit["answer_end_scored"].values() if "answer_end_scored" in unit else [learns_the_end(_variant(unit))]
    return "with the end" if all(ended) else "verbaliser alone"


def write_report(units: list[dict], path: Path) -> str:
    """``ANSWER_END.md``: each stored unit's rows beside the learnt-end pair's, each against the zero-shot base
    scored as the pair is scored (the end included for a pair that learnt it, the verbaliser alone for the other)."""
    stored = {(_variant(u), u["seed"], u["what"]): u for u in units}
    order = (ZERO_SHOT, INDIVIDUAL, NON_PRIVATE)
    rows = []
    first = {}  # the learnt pair's rows go once, beside the first variant's unit of each seed and model
    for unit in sorted(units, key=lambda u: list(VARIANTS).index(_variant(u))):
        first.setdefault((unit["seed"], unit["what"]), _variant(unit))
    for unit in sorted(units, key=lambda u: (u["seed"], order.index(u["what"]) if u["what"] in order else 3,
                                             u["what"], list(VARIANTS).index(_variant(u)))):
        variant, seed, what = _variant(unit), unit["seed"], unit["what"]
        scoring = _scoring(unit)
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
            f"Generated by `python -m benchmarks.answer_end` from {len(units)} stored units (protocol: the module "
            "docstring). The adapters: the causal recipe's chosen candidate "
            f"(`{causal_merge.CANDIDATE}`, plain DP-SGD, ε = 8) with the answer's end learnt (stored units of "
            "`benchmarks.causal_merge`), left out of the loss (`--train_answer_end false`), or learnt with the "
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
            markdown_table(["model", "seed", "task", "answer's end", "scoring", "accuracy", "gain",
                            "of the non-private gain", "gain kept",
                            "end of sequence first", "answer is a verbaliser", "begins with a verbaliser",
                            "begins with the gold one"], rows),
            ""]
    write_text_atomic(path, "\n".join(text))
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.answer_end", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="no_answer_end",
                        help="the benchmarks.causal_recipe variant whose kept pair is scored")
    parser.add_argument("--kept", type=Path, required=True,
                        help="the causal_recipe study's kept adapters (<its work-dir>/kept)")
    parser.add_argument("--base", type=Path, required=True, help="the base the kept adapters trained on")
    parser.add_argument("--tasks", default=",".join(causal_merge.TASKS))
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--methods", default=",".join(merging.METHODS), help="a subset of the merge methods")
    parser.add_argument("--max-eval-samples", type=int, default=500,
                        help="each task's stratified test subset (as benchmarks.causal_merge scores it)")
    parser.add_argument("--work-dir", type=Path, default=harness.REPO / "runs_causal" / "answer-end-work")
    parser.add_argument("--units-dir", type=Path, default=REPORT_DIR / "units")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    tasks, methods = args.tasks.split(","), args.methods.split(",")
    if unknown := sorted(set(methods) - set(merging.METHODS)):
        parser.error(f"--methods: unknown {unknown}; the methods are {list(merging.METHODS)}")
    if not args.report_only:
        for seed in map(int, args.seeds.split(",")):
            runs = {t: kept_run(args.kept, t, seed, variant=args.variant) for t in tasks}
            if missing := [t for t, run in runs.items() if not (run / "adapter").is_dir()]:
                parser.error(f"--kept {args.kept}: no kept {args.variant} adapter of seed {seed} on {missing}")
            private = [t for t in tasks if (kept_run(args.kept, t, seed, math.inf, args.variant) / "adapter").is_dir()]
            # a pair that learnt the end is scored as the learnt pair, whose stored zero-shot unit is the floor
            floor = () if learns_the_end(args.variant) else (ZERO_SHOT,)
            todo = [(what, tasks) for what in (*floor, INDIVIDUAL, *methods)] + (
                [(NON_PRIVATE, private)] if private else [])
            for what, unit_tasks in todo:
                path = args.units_dir / f"{args.variant}-seed{seed}-{what}.json"
                if not path.exists():
                    print(f"[answer_end] {path.stem}", file=sys.stderr, flush=True)
                    run_unit(args.kept, args.base, unit_tasks, seed, what, args.work_dir.resolve(),
                             args.max_eval_samples, path, args.variant)
    units = [json.loads(p.read_text()) for p in sorted(args.units_dir.glob("*.json"))]
    print(write_report(units, REPORT_DIR / "ANSWER_END.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
