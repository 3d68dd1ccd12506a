"""A DP recipe for the packaged SmolLM2 chosen on validation (docs/causal-lm.md).

``--stage select``: the zero-shot base and every candidate of :data:`CANDIDATES` on :data:`SELECT_TASK`'s validation
split at ε = 8, seed 0; chosen: the highest accuracy. ``--stage anchor``: the chosen candidate with the public anchor
at each μ of :data:`ANCHOR_GRID`. ``--stage report``: the zero-shot base and the chosen candidate (``--variant``:
with a variant's flags, :data:`VARIANTS`) on the whole test split of ``--tasks`` at ``--epsilon`` (inf: without
privacy) and ``--seeds``; their adapters are kept in ``<work-dir>/kept/<unit>/<task>/``. ``--stage generation``:
each kept adapter alone through stock ``pipeline("text-generation")``. Every candidate is
``examples/train_causal_lm.py``, LoRA on q/v of the top 4 of 30 layers on the cached prefix (link
``<work-dir>/prefix_cache`` to reuse an earlier run's), plain DP-SGD, about 10k example passes. Report
``benchmarks/reports/causal_recipe/CAUSAL_RECIPE.md``.

    python -m benchmarks.studies.causal_recipe --stage select
    python -m benchmarks.studies.causal_recipe --stage report --tasks rotten_tomatoes,election_tweets,bbc_news
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import shutil
import sys
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.causal import NON_PRIVATE, run, score_kept_generation
from benchmarks.harness import Unit, listed
from benchmarks.markdown import table

SELECT_TASK = "bbc_news"
ZERO_SHOT = "zero_shot"
TARGET_GAIN = 10.0  # points over the zero-shot base each DP adapter should gain (docs/causal-lm.md)
COMMON = ("--lora_layers", "top_4", "--physical_batch_size", "16", "--cache_prefix", "true",
          "--lr_scheduler_type", "constant", "--per_sample_max_grad_norm", "1.0", "--logging_steps", "5")
PLAIN_DP_SGD = ("--sam_mode", "none", "--align_lambda", "0")


def _recipe(batch: int, steps: int, lr: str, rank: int = 8, ffa: bool = False,
            step: tuple[str, ...] = PLAIN_DP_SGD) -> tuple[str, ...]:
    lora = ("--lora_r", str(rank), "--lora_alpha", str(2 * rank), "--lora_freeze_a", str(ffa).lower())
    return (*COMMON, *lora, "--per_device_train_batch_size", str(batch), "--max_steps", str(steps),
            "--learning_rate", lr, *step)


CANDIDATES: dict[str, tuple[str, ...]] = {
    # A and B trained (≈ 61k noised coordinates)
    "b256_t40_lr1e-3": _recipe(256, 40, "1e-3"),
    # FFA-LoRA (A frozen from the public seed, B trained): 24.6k (r = 8) and 6.1k (r = 2) noised coordinates,
    # the noise vector's norm σC√d/B falling with √d; α = 2r keeps the scaling α/r of the full run
    "ffa_r8_b256_t40_lr3e-3": _recipe(256, 40, "3e-3", rank=8, ffa=True),
    "ffa_r2_b256_t40_lr3e-3": _recipe(256, 40, "3e-3", rank=2, ffa=True),
    # (near) full-batch DP gradient descent (q ≈ 1 on bbc_news; Mehta et al., TMLR 2023): few large steps, the
    # least noise per step (σC√d/B ≈ 0.30 against ≈ 0.86 at B = 256)
    "b1600_t12_lr1e-2": _recipe(1600, 12, "1e-2"),
}
"""The equal-budget candidates stored in ``units/`` (≈ 10k example passes; the full-batch one ≈ 19k). Pruned before
running, for time, once every 10k-pass candidate stayed at or below zero-shot: FFA r = 2 at 128 × 80 and the full
run's own recipe (its test score is in ``benchmarks/reports/causal_full``)."""


FULL_BATCH = "full"
"""A variant's expected batch that stands for the task's number of training rows (q = 1)."""
VARIANTS: dict[str, tuple[str, ...]] = {
    # DP-Merging's training step (paper 000: DP-SAT and the alignment penalty, the settings of the encoder's LP-FT
    # candidate and of the full run), on top of a candidate's flags: the paper's question against plain DP-SGD
    "dp_merging": ("--sam_mode", "dp_sat", "--sam_rho", "0.05", "--align_lambda", "0.05"),
    # the chosen candidate's q ≈ 1 (bbc_news: 1600 of 1602 rows) on every task: the expected batch is the task's
    # training split (full-batch DP gradient descent), resolved per task by unit_argv
    "full_batch": ("--per_device_train_batch_size", FULL_BATCH),
    # the end-of-sequence token after each verbaliser left out of the loss: every merge of two adapters that learned
    # to end answers answered with the end of the turn first (docs/causal-lm.md, "Ending the answer")
    "no_answer_end": ("--train_answer_end", "false"),
    # the public anchor (docs/design.md §14.1): μ·KL(base ‖ adapter) on the base's answers to the packaged public
    # prompts, added after the noise; μ = 1 weighs it as the task's loss
    "public_anchor": ("--anchor_lambda", "1"),
    "public_anchor_mu3": ("--anchor_lambda", "3"),
}
"""Report-stage variants of the chosen candidate (``--variant``): its flags, then these (later flags win); the unit's
candidate is ``<candidate>+<variant>``."""

ANCHOR_GRID: dict[str, float] = {"public_anchor": 1.0, "public_anchor_mu3": 3.0}
"""The anchor stage's variants and their μ, each trained on :data:`SELECT_TASK`'s validation split at ε = 8, seed 0;
μ = 0 is the chosen candidate's own select unit."""


def candidate_flags(candidate: str) -> tuple[str, ...]:
    """A candidate's flags, or ``<candidate>+<variant>``'s: the candidate's, then the variant's."""
    name, _, variant = candidate.partition("+")
    return (*CANDIDATES[name], *VARIANTS[variant]) if variant else CANDIDATES[name]




def flags(task: str, candidate: str, epsilon: float) -> list[str]:
    """A unit's candidate flags (:data:`FULL_BATCH` resolved) and privacy (ε = inf: the candidate without it)."""
    # without privacy: shuffled batches of the expected size, the remainder dropped (at B = 1600 on bbc_news' 1602
    # rows every other step would otherwise be a 2-row batch)
    privacy = ([*NON_PRIVATE, "--dataloader_drop_last", "true"] if math.isinf(epsilon)
               else ["--target_epsilon", f"{epsilon:g}"])
    return [*(str(training_rows(task)) if flag == FULL_BATCH else flag for flag in candidate_flags(candidate)),
            *privacy]


def causal_unit(task: str, candidate: str, split: str, epsilon: float, seed: int) -> Unit:
    """One training unit, or the zero-shot base's score (:data:`ZERO_SHOT`, no ε)."""
    zero = candidate == ZERO_SHOT
    settings = {"stage": "zero_shot" if zero else "train", "task": task, "candidate": candidate, "split": split,
                "epsilon": None if zero else epsilon, "seed": 0 if zero else seed}
    return Unit(f"{task}-{candidate}-{split}-eps{0 if zero else epsilon:g}-seed{settings['seed']}",
                settings if zero else {**settings, "flags": flags(task, candidate, epsilon)})


def trained(stored: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The training and zero-shot units as one dict each: settings and result."""
    return [u["settings"] | u["result"] for u in stored if u["settings"]["stage"] != "generation"]


def zero_shot_score(work_dir: Path, task: str, split: str) -> float:
    """The base's verbaliser-scoring accuracy on ``split`` (the prompt format and ``max_length`` of the script)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_dpmerge.analysis.causal_evaluation import task_score
    from hf_dpmerge.data.load import load_task
    from hf_dpmerge.scripts.train_causal_lm import CausalScriptArguments

    base = work_dir / "runs_causal" / "base"
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    splits, spec = load_task(task)
    tokenizer = AutoTokenizer.from_pretrained(base)
    score = task_score(model, tokenizer, spec, splits[split], CausalScriptArguments.max_length)
    del model
    gc.collect()
    return score


def training_rows(task: str) -> int:
    """The number of rows of ``task``'s training split as the causal script loads it (the whole split)."""
    from hf_dpmerge.data.load import load_task

    return len(load_task(task)[0]["train"])


def select_units(units: list[dict]) -> dict[str, dict]:
    """The units the recipe is chosen from, by candidate: :data:`SELECT_TASK`'s validation split at ε = 8, seed 0
    (the zero-shot base, every candidate and every anchor-stage variant)."""
    return {u["candidate"]: u for u in units
            if u["task"] == SELECT_TASK and u["split"] == "validation" and u["seed"] == 0 and u["epsilon"] == 8}


def chosen_candidate(units: list[dict]) -> tuple[str | None, dict[str, float]]:
    """The candidate with the highest validation accuracy on :data:`SELECT_TASK` at ε = 8, seed 0 (None until every
    candidate's select unit is stored), and every stored candidate's score."""
    scores = {candidate: u["score"] for candidate, u in select_units(units).items()
              if candidate in CANDIDATES}  # not the zero-shot base, nor a variant of the anchor stage
    complete = set(CANDIDATES) <= set(scores)
    return (max(scores, key=scores.get) if complete else None), scores


def chosen_anchor(units: list[dict], chosen: str) -> tuple[float | None, dict[float, float]]:
    """The public anchor's μ with the highest validation accuracy on :data:`SELECT_TASK` at ε = 8, seed 0, among
    μ = 0 (``chosen``'s own select unit) and :data:`ANCHOR_GRID` (None until every one is stored; a tie keeps the
    smaller μ), and every stored μ's score."""
    select = {candidate: u["score"] for candidate, u in select_units(units).items()}
    scores = {0.0: select[chosen]} if chosen in select else {}
    scores |= {mu: select[f"{chosen}+{variant}"] for variant, mu in ANCHOR_GRID.items()
               if f"{chosen}+{variant}" in select}
    return (max(scores, key=scores.get) if len(scores) == len(ANCHOR_GRID) + 1 else None), scores


def seed_rows(by: dict[tuple[str, str, float, int], dict], zero: dict[tuple[str, str], float]) -> list[list[str]]:
    """One row per task, finite ε and candidate with two or more seeds scored with the end on the test split: the
    adapter per seed, the mean, the gain over the zero-shot base (mean and worst seed) and how many seeds reach
    :data:`TARGET_GAIN`."""
    seeds: dict[tuple[str, float, str], dict[int, float]] = {}
    for (task, candidate, epsilon, seed), unit in by.items():
        if candidate != ZERO_SHOT and not math.isinf(epsilon) and unit["answer_end_scored"]:
            seeds.setdefault((task, epsilon, candidate), {})[seed] = 100 * unit["score"]
    rows = []
    for (task, epsilon, candidate), scores in sorted(seeds.items(), key=lambda k: (k[0][0], -k[0][1], k[0][2])):
        if len(scores) < 2 or (task, "test") not in zero:
            continue
        gains = [score - 100 * zero[(task, "test")] for score in scores.values()]
        rows.append([task, f"{epsilon:g}", candidate, ",".join(map(str, sorted(scores))),
                     " ".join(f"{scores[s]:.1f}" for s in sorted(scores)), f"{sum(scores.values()) / len(scores):.1f}",
                     f"{sum(gains) / len(gains):+.1f} ({min(gains):+.1f})",
                     f"{sum(g >= TARGET_GAIN for g in gains)} of {len(gains)}"])
    return rows


def causal_report(units: list[dict], generation: list[dict]) -> str:
    """CAUSAL_RECIPE.md from the training and zero-shot units and the generation units."""
    chosen, scores = chosen_candidate(units)
    zero = {(u["task"], u["split"]): u["score"] for u in units if u["candidate"] == ZERO_SHOT}
    select = select_units(units)
    rows = [[c, " ".join(CANDIDATES[c][len(COMMON):]),
             f"{100 * select[c]['score']:.1f}" if c in select else "—",
             f"{select[c]['noise_multiplier']:.2f} / {select[c]['sample_rate']:.3f}" if c in select else "—",
             f"{select[c]['seconds'] / 60:.1f}" if c in select else "—"] for c in CANDIDATES]
    floor = zero.get((SELECT_TASK, "validation"))
    text = ["# A DP recipe for SmolLM2, chosen on validation", "",
            f"Generated by `python -m benchmarks.studies.causal_recipe --report-only` from {len(units)} stored units "
            "(protocol: the module docstring). Accuracy in %, verbaliser scoring.", "",
            f"## Select ({SELECT_TASK}, validation split, ε = 8, seed 0)", "",
            f"Zero-shot base: {'—' if floor is None else f'{100 * floor:.1f}'}. Every candidate also takes "
            f"`{' '.join(COMMON)}`.", "",
            table(["candidate", "flags", "validation accuracy", "σ / q", "unit (min)"], rows), "",
            f"Chosen: `{chosen}`." if chosen else "Chosen: — (select stage incomplete).", ""]
    mu, anchor_scores = chosen_anchor(units, chosen) if chosen else (None, {})
    if len(anchor_scores) > 1:
        seconds = {candidate: u["seconds"] for candidate, u in select.items()}
        variant_of = {0.0: None, **{m: v for v, m in ANCHOR_GRID.items()}}
        rows = [[f"{m:g}", f"{100 * score:.1f}",
                 f"{seconds[chosen if variant_of[m] is None else f'{chosen}+{variant_of[m]}'] / 60:.1f}"]
                for m, score in sorted(anchor_scores.items())]
        text += [f"## The public anchor's weight ({SELECT_TASK}, validation split, ε = 8, seed 0)", "",
                 f"`{chosen}` with `--anchor_lambda μ` (`--stage anchor`; μ = 0 is its select unit above).", "",
                 table(["μ", "validation accuracy", "unit (min)"], rows), "",
                 f"Chosen: μ = {mu:g}." if mu is not None else "Chosen: — (anchor stage incomplete).", ""]
    tested = sorted({(u["task"], u["epsilon"], u["seed"]) for u in units if u["split"] == "test"
                     and u["candidate"] != ZERO_SHOT}, key=lambda k: (k[0], -k[1], k[2]))
    if tested:
        by = {(u["task"], u["candidate"], u["epsilon"], u["seed"]): u for u in units if u["split"] == "test"}
        rows = []
        for task, epsilon, seed in tested:
            zs = zero.get((task, "test"))
            for candidate in sorted(c for t, c, e, s in by if (t, e, s) == (task, epsilon, seed)
                                    and c != ZERO_SHOT):
                unit = by[(task, candidate, epsilon, seed)]
                # the zero-shot base is scored with the end; a unit scored on the verbaliser alone has no floor here
                # (the answer_end study scores one), and a share needs the non-private adapter scored the same way
                with_end = unit["answer_end_scored"]
                floor = zs if with_end else None
                plain = next((p for p in (by.get((task, candidate, math.inf, seed)),
                                          by.get((task, candidate.partition("+")[0], math.inf, seed)))
                              if p is not None and p["answer_end_scored"] == with_end), None)
                share = ("—" if floor is None or plain is None or math.isinf(epsilon) or plain["score"] <= floor
                         else f"{(unit['score'] - floor) / (plain['score'] - floor):.0%}")
                rows.append([task + (" (select)" if task == SELECT_TASK else ""),
                             "∞ (non-private)" if math.isinf(epsilon) else f"{epsilon:g}", str(seed), candidate,
                             "with the end" if with_end else "verbaliser alone",
                             "—" if floor is None else f"{100 * floor:.1f}", f"{100 * unit['score']:.1f}",
                             "—" if floor is None else f"{100 * (unit['score'] - floor):+.1f}", share,
                             f"{unit['seconds'] / 60:.1f}"])
        text += ["## Report (whole test split)", "",
                 table(["task", "ε", "seed", "candidate", "scoring", "zero-shot", "adapter", "gain (points)",
                                 "share of the non-private gain", "unit (min)"], rows), ""]
        seeded = seed_rows(by, zero)
        if seeded:
            text += ["## Over seeds (whole test split, scored with the end)", "",
                     f"Each seed is one adapter; the target is a gain of +{TARGET_GAIN:g} points at every seed.", "",
                     table(["task", "ε", "candidate", "seeds", "adapter per seed", "mean", "gain: mean (min)",
                                     f"seeds at ≥ +{TARGET_GAIN:g}"], seeded), ""]
    if generation:
        text += ["## Stock generation of each adapter alone", "",
                 "Greedy `pipeline(\"text-generation\")`, the question as a chat message, stratified test examples.",
                 "", table(["adapter (unit)", "n", "answer = ranked-first verbaliser", "answer = gold",
                                     "answer is a verbaliser", "first answers"],
                                    [[g["unit"], str(g["n"]), f"{g['generation_is_ranked_first']:.0%}",
                                      f"{g['generation_is_gold']:.0%}", f"{g['generation_is_a_verbaliser']:.0%}",
                                      ", ".join(repr(e["answer"]) for e in g["examples"][:3])]
                                     for g in generation]), ""]
    return "\n".join(text)



class CausalRecipe(harness.Study, name="causal_recipe", schema=1):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--stage", choices=("select", "anchor", "report", "generation"), default="select")
        parser.add_argument("--tasks", default="rotten_tomatoes,election_tweets,bbc_news", help="report stage")
        parser.add_argument("--seeds", default="0", help="report stage: the seeds")
        parser.add_argument("--epsilon", type=float, default=8.0,
                            help="report stage: the target ε (inf: the same recipe without privacy)")
        parser.add_argument("--variant", choices=sorted(VARIANTS),
                            help="report stage: train the chosen candidate with this variant's flags on top")
        parser.add_argument("--candidates", help="select stage: only these candidates (comma-separated), in order")

    def plan(self, args: argparse.Namespace) -> list[Unit]:
        stored = harness.Store(args.units_dir, self.schema).results()
        if args.stage == "generation":  # each kept adapter of the report stage
            return [Unit(f"generation-{u['name']}", {"stage": "generation", "unit": u["name"],
                                                     "task": u["settings"]["task"]}) for u in stored
                    if u["settings"]["stage"] == "train" and u["settings"]["split"] == "test"
                    and (args.work_dir.resolve() / "kept" / u["name"]).is_dir()]
        if args.stage == "select":
            names = listed(args.candidates, list(CANDIDATES), "--candidates") if args.candidates else list(CANDIDATES)
            return [causal_unit(SELECT_TASK, c, "validation", 8.0, 0) for c in [*names, ZERO_SHOT]]
        chosen, _ = chosen_candidate(trained(stored))
        if chosen is None:
            raise ValueError("the select stage is incomplete: run --stage select first")
        if args.stage == "anchor":
            return [causal_unit(SELECT_TASK, f"{chosen}+{variant}", "validation", 8.0, 0) for variant in ANCHOR_GRID]
        candidate = f"{chosen}+{args.variant}" if args.variant else chosen
        return [causal_unit(task, c, "test", args.epsilon, seed) for seed in map(int, args.seeds.split(","))
                for task in args.tasks.split(",") for c in (candidate, ZERO_SHOT)]

    def run(self, unit: Unit, work_dir: Path) -> dict[str, Any]:
        """Score the base (zero-shot) or a kept adapter's generation, or train a candidate with the causal script
        in ``work_dir`` (its test-split adapters kept)."""
        from hf_dpmerge.records.record import PrivacyRecord

        s = unit.settings
        if s["stage"] == "zero_shot":
            return {"score": zero_shot_score(work_dir, s["task"], s["split"])}
        if s["stage"] == "generation":
            return score_kept_generation(work_dir, work_dir / "kept" / s["unit"])
        run_dir = work_dir / "runs_causal" / s["task"]
        shutil.rmtree(run_dir, ignore_errors=True)  # a killed unit starts again
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        run([sys.executable, str(harness.REPO / "examples" / "train_causal_lm.py"), *s["flags"], "--task", s["task"],
             "--runs_dir", "runs_causal", "--prefix_cache_dir", str(work_dir / "prefix_cache"), "--eval_split",
             s["split"], "--seed", str(s["seed"]), "--overwrite", "true", "--disable_tqdm", "true"],
            work_dir, work_dir / "log.txt")
        summary = json.loads((run_dir / "eval_metrics.json").read_text())
        record = PrivacyRecord.load(run_dir / "adapter")
        if s["split"] == "test":
            kept = work_dir / "kept" / unit.name
            shutil.rmtree(kept, ignore_errors=True)
            kept.mkdir(parents=True)
            shutil.move(run_dir, kept / s["task"])
        shutil.rmtree(run_dir, ignore_errors=True)
        return {"score": next(iter(summary[s["split"]].values())),
                "answer_end_scored": record.answer_end_trained,  # the script scores as hf-dpmerge evaluate does
                "achieved_epsilon": summary["epsilon"], "steps": summary["steps"],
                "noise_multiplier": record.noise_multiplier, "sample_rate": record.sample_rate}

    def report(self, stored: list[dict[str, Any]]) -> dict[str, str]:
        generation = [u["result"] | {"unit": u["settings"]["unit"], "task": u["settings"]["task"]} for u in stored
                      if u["settings"]["stage"] == "generation"]
        return {"CAUSAL_RECIPE.md": causal_report(trained(stored), generation)}


if __name__ == "__main__":
    sys.exit(harness.main(CausalRecipe()))
