"""The paper's question on private LP-FT adapters: phase 2 by DP-SGD or by DP-Merging (DP-SAT + alignment), merged.

For each seed whose adapters the lpft study kept for both an LP-FT default (``--recipe``, phase 2 plain DP-SGD) and
its DP-Merging twin at ``--epsilon``, on every task of ``--tasks``: one unit per (trainer, seed, method) merges the
tasks' encoder adapters by ``merge_configs/<method>.yaml`` (``hf-dpmerge merge``) and scores individual and merged
accuracy on the whole test splits; a factor-space method is also merged ``--as-adapter`` and compared with the dense
merge. Reports per recipe and ε in ``benchmarks/reports/lpft_merge/<recipe>[-eps<ε>]/LPFT_MERGE.md``, against the
lpft study's private heads; docs/benchmarks.md "Private LP-FT".

    python -m benchmarks.studies.lpft_merge                      # the default recipe at ε = 8
    python -m benchmarks.studies.lpft_merge --epsilon 4 --tasks rotten_tomatoes,election_tweets
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.harness import Unit, listed
from benchmarks.markdown import table
from benchmarks.merging import (
    METHODS,
    TRAINERS,
    comparison,
    merge_config,
    packaged_parameters,
    run_merge,
    stage_runs,
    trainer_evidence,
)
from hf_dpmerge.merging.adapters.factor_space import FACTOR_METHODS

EPSILON, HEAD = 8.0, "private_head"
EVIDENCE = "hf_dpmerge/merging/data/dp_merging_lpft.json"
"""What ``hf-dpmerge recommend``'s trainer advice reads from this study (:meth:`LpftMerge.exports`)."""
DEFAULT_RECIPE = "k2_b1024_t75_lr1e-2_head6_dpsgd"
"""``LPFT_RECIPE``'s candidate in the lpft study (``benchmarks/reports/lpft/LPFT.md``)."""
TWIN = {recipe: recipe.removesuffix("_dpsgd") for recipe in (DEFAULT_RECIPE, "k2_b1024_t75_lr3e-3_head6_dpsgd")}
"""Each LP-FT default, today's and the earlier one → its DP-Merging twin: the same recipe with DP-SAT + alignment in
phase 2, named without the ``_dpsgd`` suffix."""
TASKS = ("rotten_tomatoes", "election_tweets", "reuters_r52")
AS_ADAPTER_METHODS = tuple(m for m in METHODS if m in FACTOR_METHODS)
"""The compared methods that ``--as-adapter`` merges exactly in factor space; ties elects signs and trims magnitudes
of dense coordinates, so no adapter equals its merge."""


def trainer_candidates(recipe: str) -> dict[str, str]:
    """Trainer → the LP-FT candidate that trained its adapters: ``recipe`` and its DP-Merging twin."""
    return dict(zip(TRAINERS, (recipe, TWIN[recipe])))


def folder(recipe: str, epsilon: float) -> str:
    """A (recipe, ε) comparison's report folder: ``<recipe>`` at ε = 8, ``<recipe>-eps<ε>`` otherwise."""
    return recipe + ("" if epsilon == EPSILON else f"-eps{epsilon:g}")


def as_adapter_deviation(base: Path, dense: Path, adapter: Path) -> dict[str, float]:
    """The ``--as-adapter`` merge against the dense one: ``max_abs_difference`` = max |W_adapter − W_dense| over
    every tensor of the dense merge, W_adapter being the base with the merged adapter folded in by stock peft
    (``merge_and_unload``); ``max_abs_task_vector`` = max |W_dense − W_base| (what the merge moved, for scale);
    the sizes in bytes of the two weights files."""
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification

    from hf_dpmerge.utils.adapter_files import ADAPTER_SAFETENSORS_NAME

    model = AutoModelForSequenceClassification.from_pretrained(base)
    base_state = {k: w.clone() for k, w in model.state_dict().items()}
    folded_state = PeftModel.from_pretrained(model, adapter).merge_and_unload().state_dict()
    dense_file = dense / "model.safetensors"
    dense_state = load_file(dense_file)
    if missing := sorted(set(dense_state) - set(folded_state)):
        raise ValueError(f"{dense}: tensors {missing[:3]} are not the base model's")
    return {"max_abs_difference": max(float((folded_state[k] - w).abs().max()) for k, w in dense_state.items()),
            "max_abs_task_vector": max(float((w - base_state[k]).abs().max()) for k, w in dense_state.items()),
            "adapter_bytes": (adapter / ADAPTER_SAFETENSORS_NAME).stat().st_size,
            "dense_bytes": dense_file.stat().st_size}


def as_adapter_section(units: list[dict]) -> str:
    """Per method and trainer: the units checked, the largest deviation from the dense merge and of the dense task
    vector, and the weights' size ratio."""
    rows = []
    for method in AS_ADAPTER_METHODS:
        for trainer in TRAINERS:
            checked = [u["as_adapter"] for u in units
                       if u["method"] == method and u["trainer"] == trainer and "as_adapter" in u]
            if checked:
                rows.append([method, trainer, str(len(checked)),
                             f"{max(c['max_abs_difference'] for c in checked):.1e}",
                             f"{max(c['max_abs_task_vector'] for c in checked):.1e}",
                             f"{max(c['dense_bytes'] / c['adapter_bytes'] for c in checked):.0f}×"])
    if not rows:
        return ""
    return "\n".join([
        "## `--as-adapter`: the factor-space merge against the dense one", "",
        "Each unit of a method below also merged its adapters with `hf-dpmerge merge --as-adapter` (the same YAML); "
        "the merged adapter, folded into the base by stock peft, is compared with the dense merge tensor by tensor. "
        "Its accuracy is the dense row's when the deviation is float rounding against the task vector. "
        "`ties` has no such merge (sign election acts on dense coordinates).", "",
        table(["method", "trainer", "units", "max abs deviation from dense", "max abs dense task vector",
               "dense / adapter weights (bytes)"], rows), "", ""])


def head_floors() -> dict[float, dict[tuple[str, int], float]]:
    """ε → (task, seed) → test accuracy % of the lpft study's MiniLM private heads."""
    found: dict[float, dict[tuple[str, int], float]] = {}
    for u in harness.stored("lpft", 1):
        s = u["settings"]
        if s["base"] == "minilm" and s["candidate"] == HEAD:
            found.setdefault(s["target_epsilon"], {})[(s["task"], s["seed"])] = 100 * u["result"]["test"]["accuracy"]
    return found


def groups(stored: list[dict[str, Any]]) -> dict[tuple[str, float], list[dict]]:
    """The stored units (settings | result) by (recipe, ε)."""
    found: dict[tuple[str, float], list[dict]] = {}
    for unit in stored:
        s = unit["settings"]
        found.setdefault((s["recipe"], s["target_epsilon"]), []).append(s | unit["result"])
    return found


class LpftMerge(harness.Study, name="lpft_merge", schema=1):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--kept", type=Path, default=harness.REPO / "runs" / "lpft" / "kept",
                            help="the lpft study's kept adapters (its <work-dir>/kept)")
        parser.add_argument("--base", type=Path, default=harness.REPO / "runs" / "lpft" / "base",
                            help="the shared base the LP-FT units trained on (the lpft study's <work-dir>/base)")
        parser.add_argument("--tasks", default=",".join(TASKS))
        parser.add_argument("--methods", default=",".join(METHODS), help="a subset of the merge methods")
        parser.add_argument("--recipe", choices=sorted(TWIN), default=DEFAULT_RECIPE,
                            help="the LP-FT default whose DP-SGD adapters meet their DP-Merging twin's")
        parser.add_argument("--epsilon", type=float, default=EPSILON,
                            help="the target ε the kept adapters and the private heads were trained at")

    def plan(self, args: argparse.Namespace) -> list[Unit]:
        """Every seed with both trainers' adapters kept on every task at ``--epsilon``, read from the lpft study's
        stored units (their names are the kept folders)."""
        tasks, methods = args.tasks.split(","), listed(args.methods, METHODS, "--methods")
        trainers = trainer_candidates(args.recipe)
        self.base, kept = args.base.resolve(), {}
        for unit in harness.stored("lpft", 1):
            s = unit["settings"]
            run = args.kept.resolve() / unit["name"] / s["task"]
            if (s["base"], s["target_epsilon"]) == ("minilm", args.epsilon) and (run / "encoder_adapter").is_dir():
                kept[(s["task"], s["candidate"], s["seed"])] = run
        self.kept = kept
        seeds = sorted({seed for (_, _, seed) in kept
                        if all((t, c, seed) in kept for t in tasks for c in trainers.values())})
        if not seeds:
            raise ValueError(f"--kept {args.kept}: no seed has both trainers' adapters ({trainers}) at --epsilon "
                             f"{args.epsilon:g} on {', '.join(tasks)}")
        return [Unit(f"{folder(args.recipe, args.epsilon)}-{trainer}-seed{seed}-{method}",
                     {"recipe": args.recipe, "target_epsilon": args.epsilon, "trainer": trainer, "candidate": candidate,
                      "seed": seed, "method": method, "tasks": tasks,
                      "merge_parameters": packaged_parameters(method)})
                for seed in seeds for trainer, candidate in trainers.items() for method in methods]

    def run(self, unit: Unit, work_dir: Path) -> dict[str, Any]:
        """Merge one (trainer, seed)'s adapters of its tasks with its method and evaluate; the factor-space methods
        also ``--as-adapter``."""
        from hf_dpmerge.analysis.evaluation import evaluate_runs
        from hf_dpmerge.cli.merge_command import run_as_adapter

        s = unit.settings
        cell = work_dir / folder(s["recipe"], s["target_epsilon"]) / f"{s['candidate']}-seed{s['seed']}"
        runs = stage_runs(cell / "runs", self.base, {t: self.kept[(t, s["candidate"], s["seed"])] for t in s["tasks"]})
        config = merge_config(s["method"], runs / "base", [runs / task / "encoder_adapter" for task in s["tasks"]],
                              parameters=s["merge_parameters"])
        merged, config_path = cell / "merged" / s["method"], cell / f"{s['method']}.yaml"
        run_merge(config, config_path, merged, cell / "lora_cache")
        result = {"evaluation": evaluate_runs(runs, merged, s["tasks"], base_dir=runs / "base",
                                              progress=False).to_dict()}
        if s["method"] in AS_ADAPTER_METHODS:
            adapter = run_as_adapter(config_path, cell / "adapter" / s["method"], overwrite=True)
            result["as_adapter"] = as_adapter_deviation(runs / "base", merged, adapter)
            shutil.rmtree(adapter, ignore_errors=True)
        shutil.rmtree(merged, ignore_errors=True)
        return result

    def report(self, stored: list[dict[str, Any]]) -> dict[str, str]:
        """One report per (recipe, ε): the comparison against the private heads at that ε and the ``--as-adapter``
        check."""
        heads = head_floors()
        return {f"{folder(recipe, epsilon)}/LPFT_MERGE.md": comparison(
            units, heads.get(epsilon, {}),
            title=f"Merging private LP-FT adapters: DP-SGD vs DP-Merging in phase 2 (ε = {epsilon:g})",
            preamble=[f"Generated by `python -m benchmarks.studies.lpft_merge --report-only` from {len(units)} stored "
                      "units. Test accuracy %, whole test splits, task averages, means over seeds; gain retained over "
                      f"the private head of the same seed at ε = {epsilon:g} (benchmarks/reports/lpft/units)."],
            floor_label="private head",
            footer=as_adapter_section(units) + "Trainers: "
            + "; ".join(f"`{tr}` = LP-FT candidate `{c}`" for tr, c in trainer_candidates(recipe).items())
            + " (benchmarks/studies/lpft.py). Merge parameters: merge_configs/<method>.yaml as stored.")
            for (recipe, epsilon), units in groups(stored).items()}

    def exports(self, stored: list[dict[str, Any]]) -> dict[str, str]:
        """``hf-dpmerge recommend``'s evidence on the trainer: the default recipe's comparison at each ε."""
        heads = head_floors()
        return {EVIDENCE: json.dumps({
            "testbed": f"MiniLM, the LP-FT default recipe (`{DEFAULT_RECIPE}` against `{TWIN[DEFAULT_RECIPE]}`)",
            "floor": "the private head of the same seed and ε",
            "comparisons": [{"report": f"benchmarks/reports/lpft_merge/{folder(recipe, epsilon)}/LPFT_MERGE.md",
                             "epsilon": epsilon, **trainer_evidence(units, heads.get(epsilon, {}))}
                            for (recipe, epsilon), units in groups(stored).items() if recipe == DEFAULT_RECIPE]},
            indent=1, ensure_ascii=False) + "\n"}


if __name__ == "__main__":
    sys.exit(harness.main(LpftMerge()))
