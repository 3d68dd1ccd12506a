"""The paper's question on private LP-FT adapters: phase 2 by DP-SGD or by DP-Merging (DP-SAT + alignment), merged.

Adapters come from the lpft study's report stage, which keeps them: for each seed, an
LP-FT default, ``--recipe`` (:func:`trainers` ``dp_sgd``, phase 2 plain DP-SGD; default
:data:`DEFAULT_CANDIDATE`), and its twin with the package's DP-SAT step and alignment penalty
(``dp_merging``, :data:`TWIN`), at ``--epsilon`` (default 8: the LP-FT units of that target ε), on every task of
``--tasks`` (default :data:`TASKS`: the headroom tasks rotten_tomatoes and election_tweets and the topic task
reuters_r52). Each (trainer, seed, method) unit merges the tasks' encoder adapters with stock ``mergekit-yaml``
semantics (``hf-dpmerge merge`` on ``merge_configs/<method>.yaml``, its parameters as stored there, base and inputs
replaced), scores individual and merged accuracy on each task's whole test split
(:func:`hf_dpmerge.analysis.evaluation.evaluate_runs`), and is stored as JSON under
``benchmarks/reports/lpft-merge/<recipe>/units`` (``<recipe>-eps<ε>/`` at another ε, :func:`report_dir`); that
folder's report is rewritten from them. A method that merges exactly in factor space (:data:`AS_ADAPTER_METHODS`) is
also merged with ``hf-dpmerge merge --as-adapter`` from the same YAML: the unit stores how far that adapter, folded
into the base by stock peft, is from the dense merge (:func:`as_adapter_deviation`), and the sizes of the two
outputs' weights.

Report (``LPFT_MERGE.md`` in that folder), per method and trainer, means over seeds of the task averages: individual
and merged accuracy, interference (individual − merged, points), retention (merged / individual) and gain retained
over the private head of the same seed and task (the LP-FT benchmark's unit at the same ε: (merged − head) /
(individual − head), on the averaged scores). Per method: DP-Merging − DP-SGD in task-averaged merged accuracy,
paired t over seeds (the seed is the unit: each retrains both), Holm over the methods. Per ``--as-adapter`` method:
the largest deviation from the dense merge over its units and the size ratio.

    python -m benchmarks.studies.lpft --stage report --seeds 1,2 --tasks rotten_tomatoes,election_tweets,reuters_r52
    python -m benchmarks.studies.lpft --stage report --seeds 1,2 --tasks rotten_tomatoes,election_tweets,reuters_r52 \\
        --candidates k2_b1024_t75_lr1e-2_head6   # DP-Merging, its twin
    python -m benchmarks.lpft_merge --kept runs/lpft/kept
    python -m benchmarks.lpft_merge --kept runs/lpft/kept --epsilon 4   # the units trained with --epsilon 4
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from hf_dpmerge.cli.merge_command import run_as_adapter
from hf_dpmerge.merging.factor_space import FACTOR_METHODS
from hf_dpmerge.utils.io import write_text_atomic

from . import harness, merge_comparison
from .markdown import table as markdown_table
from .merge_comparison import comparison_parser, parse_comparison, write_comparison
from .quality.run import merge_config, run_merge

REPO, EPSILON, HEAD = harness.REPO, 8.0, "private_head"
DEFAULT_CANDIDATE, EARLIER_DEFAULTS = "k2_b1024_t75_lr1e-2_head6_dpsgd", ("k2_b1024_t75_lr3e-3_head6_dpsgd",)
REPORT_DIR = REPO / "benchmarks" / "reports" / "lpft-merge"
TWIN = {recipe: recipe.removesuffix("_dpsgd") for recipe in (DEFAULT_CANDIDATE, *EARLIER_DEFAULTS)}
"""Each LP-FT default (phase 2 plain DP-SGD, the current one and the earlier ones) → its DP-Merging twin: the same
recipe with DP-SAT + alignment in phase 2, named without the ``_dpsgd`` suffix (a candidate or a report-stage twin
of ``benchmarks/studies/lpft.py``)."""
TASKS = ("rotten_tomatoes", "election_tweets", "reuters_r52")
AS_ADAPTER_METHODS = tuple(m for m in merge_comparison.METHODS if m in FACTOR_METHODS)
"""The compared merge methods that ``--as-adapter`` merges exactly in factor space (task_arithmetic, dp_aware,
cauchy_poe); ties elects signs and trims magnitudes of dense coordinates, so no adapter equals its merge."""


def epsilon_suffix(epsilon: float) -> str:
    return "" if epsilon == EPSILON else f"-eps{epsilon:g}"


def lpft_unit_name(task: str, candidate: str, seed: int, epsilon: float = EPSILON) -> str:
    """The lpft study's unit name, the folder its kept adapter lies in."""
    return f"{task}-{candidate}-seed{seed}{epsilon_suffix(epsilon)}"


def trainers(recipe: str = DEFAULT_CANDIDATE) -> dict[str, str]:
    """Trainer name (:data:`benchmarks.merge_comparison.TRAINERS`) → the LP-FT candidate that trained its adapters."""
    return dict(zip(merge_comparison.TRAINERS, (recipe, TWIN[recipe])))


def report_dir(recipe: str = DEFAULT_CANDIDATE, epsilon: float = EPSILON) -> Path:
    """Where a (recipe, ε) comparison keeps its units and report: ``<recipe>`` at ε = 8, ``<recipe>-eps<ε>``
    otherwise (the LP-FT units' naming, :func:`lpft_unit_name`)."""
    return REPORT_DIR / (recipe + epsilon_suffix(epsilon))


def kept_adapter(kept: Path, task: str, trainer: str, seed: int, recipe: str = DEFAULT_CANDIDATE,
                 epsilon: float = EPSILON) -> Path:
    return kept / lpft_unit_name(task, trainers(recipe)[trainer], seed, epsilon) / task


def complete_seeds(kept: Path, tasks: list[str], recipe: str = DEFAULT_CANDIDATE,
                   epsilon: float = EPSILON) -> list[int]:
    """Seeds with both trainers' adapters kept at ``epsilon`` on every task."""
    return merge_comparison.complete_seeds(
        kept, tasks, lambda t, tr, s: kept_adapter(kept, t, tr, s, recipe, epsilon) / "encoder_adapter")


def run_unit(kept: Path, base: Path, tasks: list[str], trainer: str, seed: int, method: str, work_dir: Path,
             path: Path, recipe: str = DEFAULT_CANDIDATE, epsilon: float = EPSILON) -> dict:
    """Merge one (trainer, seed)'s adapters of ``tasks`` at ``epsilon`` with ``method``, evaluate, store the result
    at ``path``."""
    from hf_dpmerge.analysis.evaluation import evaluate_runs

    candidate = trainers(recipe)[trainer]
    cell = work_dir / report_dir(recipe, epsilon).name / f"{candidate}-seed{seed}"
    runs = merge_comparison.stage_runs(cell / "runs", base,
                                       {t: kept_adapter(kept, t, trainer, seed, recipe, epsilon) for t in tasks})
    config = merge_config(method, runs / "base", [runs / task / "encoder_adapter" for task in tasks])
    merged = cell / "merged" / method
    start = time.perf_counter()
    run_merge(config, cell / f"{method}.yaml", merged, cell / "lora_cache")
    evaluation = evaluate_runs(runs, merged, tasks, base_dir=runs / "base", progress=False)
    result = {"trainer": trainer, "candidate": candidate, "seed": seed, "target_epsilon": epsilon, "method": method,
              "tasks": tasks,
              "merge_parameters": config.get("parameters"), "evaluation": evaluation.to_dict(),
              "seconds": time.perf_counter() - start}
    if method in AS_ADAPTER_METHODS:
        adapter = run_as_adapter(cell / f"{method}.yaml", cell / "adapter" / method, overwrite=True)
        result["as_adapter"] = as_adapter_deviation(runs / "base", merged, adapter)
        shutil.rmtree(adapter, ignore_errors=True)
    text = json.dumps(result, indent=1, allow_nan=True).replace(str(work_dir), "<work>")  # no path of this machine
    write_text_atomic(path, text + "\n")
    shutil.rmtree(merged, ignore_errors=True)
    return result


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
    """The report's ``--as-adapter`` table: per method and trainer, the units checked, the largest deviation from
    the dense merge and of the dense task vector, and the weights' size ratio."""
    rows = []
    for method in AS_ADAPTER_METHODS:
        for trainer in merge_comparison.TRAINERS:
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
        markdown_table(["method", "trainer", "units", "max abs deviation from dense", "max abs dense task vector",
                        "dense / adapter weights (bytes)"], rows), "", ""])


def unit_name(trainer: str, seed: int, method: str) -> str:
    return f"{trainer}-seed{seed}-{method}"


def private_heads(units: list[dict], epsilon: float = EPSILON) -> dict[tuple[str, int], float]:
    """(task, seed) → the private head's test accuracy in % at ``epsilon``, from the LP-FT benchmark's units."""
    return {(u["task"], u["seed"]): 100 * u["test"]["accuracy"] for u in units
            if u["candidate"] == HEAD and u["target_epsilon"] == epsilon}


def write_report(units: list[dict], heads: dict[tuple[str, int], float], path: Path,
                 recipe: str = DEFAULT_CANDIDATE, epsilon: float = EPSILON) -> str:
    """LPFT_MERGE.md from the stored merge units (all at ``epsilon``) and the private heads' test accuracy at that ε,
    (task, seed) → %."""
    if stray := sorted({u.get("target_epsilon", EPSILON) for u in units} - {epsilon}):
        raise ValueError(f"merge units at ε = {stray} in a report at ε = {epsilon:g}")
    command = f"python -m benchmarks.lpft_merge --recipe {recipe}" + (
        "" if epsilon == EPSILON else f" --epsilon {epsilon:g}")
    return write_comparison(
        units, heads, path,
        title=f"Merging private LP-FT adapters: DP-SGD vs DP-Merging in phase 2 (ε = {epsilon:g})",
        preamble=[f"Generated by `{command}` from {len(units)} stored units. "
                  "Test accuracy %, whole test splits, task averages, means over seeds; gain retained over the private "
                  f"head of the same seed at ε = {epsilon:g} (benchmarks/reports/lpft/units)."],
        floor_label="private head",
        footer=as_adapter_section(units) + "Trainers: "
        + "; ".join(f"`{tr}` = LP-FT candidate `{c}`" for tr, c in trainers(recipe).items())
        + " (benchmarks/studies/lpft.py). Merge parameters: merge_configs/<method>.yaml as stored.")


def main(argv: list[str] | None = None) -> int:
    parser = comparison_parser(
        "python -m benchmarks.lpft_merge", __doc__, kept=REPO / "runs" / "lpft" / "kept",
        kept_help="the lpft study's kept adapters (<its work-dir>/kept)", base=REPO / "runs" / "lpft" / "base",
        base_help="the shared base the LP-FT units trained on (the lpft study's <work-dir>/base)", tasks=TASKS,
        work_dir=REPO / "runs" / "lpft-merge", units_dir=None, report=None)
    parser.add_argument("--recipe", choices=sorted(TWIN), default=DEFAULT_CANDIDATE,
                        help="the LP-FT default whose DP-SGD adapters meet their DP-Merging twin's (default: "
                             "today's); units and report default to benchmarks/reports/lpft-merge/<recipe>/")
    parser.add_argument("--epsilon", type=float, default=EPSILON,
                        help="the target ε the kept adapters and the private heads were trained at (the lpft study's "
                             "--epsilon; default %(default)g); another ε's units and report default to "
                             "benchmarks/reports/lpft-merge/<recipe>-eps<ε>/")
    args, tasks, methods = parse_comparison(parser, argv)
    folder = report_dir(args.recipe, args.epsilon)
    units_dir = args.units_dir or folder / "units"
    if not args.report_only:
        seeds = complete_seeds(args.kept, tasks, args.recipe, args.epsilon)
        if not seeds:
            parser.error(f"--kept {args.kept}: no seed has both trainers' adapters ({trainers(args.recipe)}) at "
                         f"--epsilon {args.epsilon:g} on {', '.join(tasks)}")
        for seed in seeds:
            for trainer in merge_comparison.TRAINERS:
                for method in methods:
                    path = units_dir / f"{unit_name(trainer, seed, method)}.json"
                    if not path.exists():
                        print(f"[lpft_merge] {args.recipe} {path.stem}", file=sys.stderr, flush=True)
                        run_unit(args.kept, args.base, tasks, trainer, seed, method, args.work_dir.resolve(), path,
                                 args.recipe, args.epsilon)
    units = [json.loads(p.read_text()) for p in sorted(units_dir.glob("*.json"))]
    heads = private_heads([{**u["settings"], **u["result"]} for u in harness.stored("lpft", 1)
                           if u["settings"]["base"] == "minilm"], args.epsilon)
    print(write_report(units, heads, args.report or folder / "LPFT_MERGE.md", args.recipe, args.epsilon))
    return 0


if __name__ == "__main__":
    sys.exit(main())
