"""What merges keep of what private adapters add: NAI = (merged − floor) / (individual − floor), per task and averaged.

Per seed: for each arm (train_glue.py flags on its defaults, the private LP-FT recipe) and ε, one kept training unit
per task and its floor (the head alone; the lpft and headroom studies' stored heads where their flags match), then
one unit per merge method: the seed's adapters merged by ``merge_configs/<method>.yaml``, timed, and scored
individually and merged on the whole test and validation splits, and one geometry unit (:data:`GEOMETRY`). Report:
``benchmarks/reports/merge_gain/MERGE_GAIN.md``, one section per arm and ε judged against the targets, the training
search judged on the merged model's validation accuracy (:func:`search_section`) and each arm's geometry;
docs/benchmarks.md "Merge gain".

    python -m benchmarks.studies.merge_gain --plan --seeds 0 --arms private,non_private
    python -m benchmarks.studies.merge_gain --epsilons 8,4 --methods task_arithmetic,tsv,iso_cts
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import harness, merging
from benchmarks.harness import Unit, listed
from benchmarks.markdown import table
from benchmarks.merging import (
    DATA_FREE_CONFIGS,
    merge_config,
    packaged_parameters,
    run_fingerprints,
    run_merge,
    stage_runs,
    timed_merge,
)
from benchmarks.nai import (
    BASELINE,
    Scores,
    Versus,
    against_baseline,
    best_method,
    defined_mean,
    scores,
    seeds_cell,
    tables,
    verdict,
)
from benchmarks.significance import ALPHA, holm_adjusted, p_cells, paired_p
from benchmarks.training import NON_PRIVATE_FLAGS, train_unit
from hf_dpmerge.data.tasks import PACKAGED_TASKS
from hf_dpmerge.utils.io import write_text_atomic

REPORT = "MERGE_GAIN.md"
METHODS = (*merging.METHODS, *DATA_FREE_CONFIGS)
REUSED_STUDIES = (("lpft", 1), ("headroom", 1))
"""(study, schema) whose stored MiniLM units a floor reuses when task, seed and flags are the floor's own."""
HEAD_FLAGS = ("--train_lora", "false")
TARGET_SEEDS, TARGET_NAI, TARGET_NAI_GAP, TARGET_OVER_FLOOR, TARGET_TIME_RATIO = 3, 0.60, 0.20, 0.5, 3.0
"""The targets (MiniLM's six tasks at ε = 8, three seeds): the best method other than task arithmetic keeps NAI ≥
60 % and ≥ task arithmetic's + 20 points (its merged accuracy above task arithmetic's, Holm over the methods
compared); its merged model ≥ the floor + 0.5 points on average; every method's merge time ≤ 3× task arithmetic's."""


@dataclass(frozen=True)
class Arm:
    """A training arm: train_glue.py ``flags`` on top of its defaults (the private LP-FT recipe, ``LPFT_RECIPE``),
    at ``--target_epsilon ε`` when ``private``, else with ``NON_PRIVATE_FLAGS`` (one unit for every ε). ``floor``:
    the arm its gain is measured over; None makes the arm a floor, scored but neither kept nor merged."""

    flags: tuple[str, ...] = ()
    private: bool = True
    floor: str | None = None


TASK_A_SEED = "{task_a_seed}"
"""An arm flag standing for each task's own public A seed (:func:`task_a_seed`)."""
SEARCH_AXES: dict[str, tuple[str, ...]] = {  # DP-Merging's remedy and its neighbours, one axis at a time
    **{f"sam_rho{rho}": ("--sam_mode", "dp_sat", "--sam_rho", rho) for rho in ("0.01", "0.05", "0.1")},
    "sam_per_example_rho0.05": ("--sam_mode", "per_example", "--sam_rho", "0.05"),  # ≈ 2.5× the step time
    **{f"align{lam}": ("--align_lambda", lam) for lam in ("1e-4", "1e-3", "1e-2", "5e-2")},
    **{f"rank{r}": ("--lora_r", r, "--lora_alpha", str(2 * int(r))) for r in ("4", "16")},  # scaling α/r = 2 kept
}
"""The training search judged on the merge: each axis an arm ``private_<axis>`` (floor: the private head) and its
non-private twin ``non_private_<axis>`` (the same flags without DP)."""
ARMS: dict[str, Arm] = {
    "private": Arm(floor="private_head"),  # LPFT_RECIPE: the lpft study's k2_b1024_t75_lr1e-2_head6_dpsgd
    "non_private": Arm(private=False, floor="non_private_head"),  # its twin: the same recipe without DP
    "private_average25": Arm(("--average_last_steps", "25"), floor="private_head"),  # the mean of the last 25
    "private_own_a": Arm(("--lora_a_seed", TASK_A_SEED), floor="private_head"),  # a public A per task: rank T·r
    **{f"private_{axis}": Arm(axis_flags, floor="private_head") for axis, axis_flags in SEARCH_AXES.items()},
    **{f"non_private_{axis}": Arm(axis_flags, private=False, floor="non_private_head")
       for axis, axis_flags in SEARCH_AXES.items()},
    "private_head": Arm(HEAD_FLAGS),  # the lpft study's private_head
    "non_private_head": Arm(HEAD_FLAGS, private=False),  # the headroom study's head
}
MERGED_ARMS = tuple(name for name, arm in ARMS.items() if arm.floor)


def flags(arm: str, epsilon: float | None, task: str | None = None) -> list[str]:
    """The arm's train_glue.py flags (task and seed aside): its own, then ``--target_epsilon ε``, or
    ``NON_PRIVATE_FLAGS`` but those it sets itself (a twin keeps its SAM or alignment); for a ``task``,
    :data:`TASK_A_SEED` becomes its :func:`task_a_seed`."""
    spec = ARMS[arm]
    own = [task_a_seed(task) if flag == TASK_A_SEED and task else flag for flag in spec.flags]
    if spec.private:
        return [*own, "--target_epsilon", f"{epsilon:g}"]
    pairs = zip(NON_PRIVATE_FLAGS[::2], NON_PRIVATE_FLAGS[1::2])
    return [*own, *(item for name, value in pairs if name not in own for item in (name, value))]


def task_a_seed(task: str) -> str:
    """A task's own public ``--lora_a_seed``: CRC-32 of its name (public, stable across runs and machines)."""
    return str(zlib.crc32(task.encode()) % 2**31)


def twin(arm: str) -> str | None:
    """A private arm's non-private twin: the merged arm of the same flags without DP (None if there is none)."""
    return next((name for name in MERGED_ARMS if ARMS[arm].private and not ARMS[name].private
                 and ARMS[name].flags == ARMS[arm].flags), None)


def cell(arm: str, epsilon: float | None) -> str:
    """An (arm, ε) pair's name: ``<arm>-eps<ε>`` for a private arm, ``<arm>`` for a non-private one."""
    return f"{arm}-eps{epsilon:g}" if ARMS[arm].private else arm


def training_unit(task: str, arm: str, seed: int, epsilon: float | None) -> Unit:
    epsilon = epsilon if ARMS[arm].private else None
    return Unit(f"{task}-{cell(arm, epsilon)}-seed{seed}",
                {"task": task, "arm": arm, "seed": seed, "target_epsilon": epsilon,
                 "flags": flags(arm, epsilon, task)})


def tasks_suffix(tasks: list[str]) -> str:
    """What a merge or geometry unit's name adds for tasks other than the packaged six."""
    return "" if tuple(tasks) == PACKAGED_TASKS else "-" + "+".join(tasks)


def merge_unit(arm: str, seed: int, epsilon: float | None, method: str, tasks: list[str]) -> Unit:
    """One merge of the seed's adapters of ``arm``."""
    epsilon = epsilon if ARMS[arm].private else None
    return Unit(f"merge-{cell(arm, epsilon)}-seed{seed}-{method}{tasks_suffix(tasks)}",
                {"arm": arm, "seed": seed, "target_epsilon": epsilon, "flags": flags(arm, epsilon),
                 "method": method, "tasks": tasks, "merge_parameters": packaged_parameters(method)})


GEOMETRY = {"method": BASELINE, "split": "validation", "max_samples": 256, "rho": 0.05}
"""DP-Merging's two geometric quantities (arXiv 2608.26655 §3.2; ``hf-dpmerge diagnose``) per arm and seed, on each
task's seeded stratified validation subset of ``max_samples``: each adapter's drift ‖ΔW‖_F/‖W_0‖_F and sharpness
L(w + ρ∇L/‖∇L‖) − L(w), and the interference of the task-arithmetic merge, the merge gap L(w_merge) − L(w_t). The
Hessian's top eigenvalue is left out (its power iteration costs about 20 passes per task)."""


def geometry_unit(arm: str, seed: int, epsilon: float | None, tasks: list[str]) -> Unit:
    """The :data:`GEOMETRY` of the seed's adapters of ``arm``."""
    epsilon = epsilon if ARMS[arm].private else None
    return Unit(f"geometry-{cell(arm, epsilon)}-seed{seed}{tasks_suffix(tasks)}",
                {"arm": arm, "seed": seed, "target_epsilon": epsilon, "flags": flags(arm, epsilon), "tasks": tasks,
                 "geometry": {**GEOMETRY, "merge_parameters": packaged_parameters(GEOMETRY["method"])}})


def kept_run(work_dir: Path, unit: Unit) -> Path:
    """Where ``train_unit(..., keep=True)`` keeps a training unit's released folders."""
    return work_dir / "kept" / unit.name / unit.settings["task"]


def reused_floors() -> dict[tuple[str, int, tuple[str, ...]], float]:
    """(task, seed, flags) → test accuracy % of every MiniLM unit the :data:`REUSED_STUDIES` stored."""
    found = {}
    for study, schema in REUSED_STUDIES:
        for unit in harness.stored(study, schema):
            s = unit["settings"]
            if s.get("base", "minilm") == "minilm" and "flags" in s:
                found[(s["task"], s["seed"], tuple(s["flags"]))] = 100 * unit["result"]["test"]["accuracy"]
    return found


def targets(found: dict[str, Scores], versus: dict[str, Versus]) -> list[str]:
    """The targets block of a private section: the best method other than task arithmetic by mean NAI, and every
    method's merge time."""
    nai = {m: defined_mean(s.nai) for m, s in found.items()}
    best = best_method(found, versus)
    nai_target, floor_target = "NAI ≥ 60 % and ≥ task arithmetic + 20 points", "merged ≥ floor + 0.5 points"
    if best is None or defined_mean(versus[best].nai_gaps) is None:
        rows = [[nai_target, "—", verdict(None)], [floor_target, "—", verdict(None)]]
    else:
        against, gap = versus[best], defined_mean(versus[best].nai_gaps)
        numbers = nai[best] >= TARGET_NAI and gap >= TARGET_NAI_GAP
        met = False if not numbers else None if against.adjusted is None else against.adjusted < ALPHA
        over = statistics.mean(m - f for m, f in zip(found[best].merged, found[best].floor))
        rows = [[nai_target, f"`{best}` {100 * nai[best]:.0f} %, {100 * gap:+.0f} points over task arithmetic on "
                 f"seeds {seeds_cell(against.seeds)} (Holm-adjusted p of merged accuracy: "
                 + ("no test)" if against.adjusted is None else f"{against.adjusted:.3g})"), verdict(met)],
                [floor_target, f"`{best}` {over:+.2f} points", verdict(over >= TARGET_OVER_FLOOR)]]
    ratios = {m: v.time_ratio for m, v in versus.items()}
    slow = [m for m, ratio in ratios.items() if ratio > TARGET_TIME_RATIO]
    slowest = max(ratios, key=ratios.get, default=None)
    rows.append(["each method's merge time ≤ 3× task arithmetic's",
                 "—" if slowest is None else "above: " + ", ".join(f"`{m}` {ratios[m]:.1f}×" for m in slow) if slow
                 else f"at most {ratios[slowest]:.1f}× (`{slowest}`)", verdict(None if slowest is None else not slow)])
    return ["### Targets", "",
            f"On {max(len(s.seeds) for s in found.values())} seed(s) and {len(next(iter(found.values())).task_nai)} "
            f"task(s) (the targets ask {TARGET_SEEDS} seeds and MiniLM's six tasks at ε = 8). The best method: the "
            "highest mean NAI other than task arithmetic's; the NAI target also asks its task-averaged merged accuracy "
            f"to beat task arithmetic's, Holm-adjusted p < {ALPHA} (not yet measured while there is no test).", "",
            table(["target", "value", "verdict"], rows), ""]


def section(arm: str, epsilon: float | None, tasks: tuple[str, ...], found: dict[str, Scores],
            twin_found: dict[str, Scores] | None) -> list[str]:
    """One (arm, ε, tasks) section: :func:`benchmarks.nai.tables` and, for a private arm, the drop against its
    non-private twin (``twin_found``) and the targets."""
    floor = ARMS[arm].floor
    text = [f"## `{arm}` " + ("(no DP)" if epsilon is None else f"at ε = {epsilon:g}")
            + ("" if tasks == PACKAGED_TASKS else f" on {', '.join(tasks)}"), ""]
    found = {m: s for m, s in found.items() if s.seeds}
    if not found:
        return [*text, f"No merge whose floors (`{floor}`) are all stored.", ""]
    note = f"Floor: `{floor}`, the same seed" + ("" if epsilon is None else " and ε") + ". Test accuracy %."
    if epsilon is None:
        return text + tables(found, note)
    return text + tables(found, note, twin(arm), twin_found) + targets(found, against_baseline(found))


DP_MERGING_AXES = ("private_sam_", "private_align")  # DP-Merging's remedy (arXiv 2608.26655): DP-SAM, alignment
TARGET_MERGED_GAIN, TARGET_INDIVIDUAL_COST = 1.0, 0.3  # a default: merge +1 point over DP-SGD's, ≤ 0.3 individual


def split_average(unit: dict, split: str, score: str) -> float:
    """A merge unit's task-averaged ``score`` (``individual`` or ``merged``) on ``split``, in %."""
    scored = unit["evaluation" if split == "test" else "validation"]["tasks"]
    return statistics.mean(100 * scored[t][score] for t in unit["tasks"])


def search_section(groups: dict[tuple, list[dict]], epsilon: float | None, tasks: tuple[str, ...]) -> list[str]:
    """The training search at ``epsilon`` (None: the non-private twins): per arm, task arithmetic's and the best
    other method's merged validation accuracy, the chosen arm (task arithmetic's merged validation accuracy, over
    the arms of the most seeds), then the best DP-Merging arm against DP-SGD's (``private``/``non_private``) on the
    test splits, per method paired over seeds with Holm over the methods."""
    merges = {a: {(u["method"], u["seed"]): u for u in groups.get((a, epsilon, tasks), []) if "validation" in u}
              for a in MERGED_ARMS if ARMS[a].private == (epsilon is not None)}
    merges = {a: found for a, found in merges.items() if found}
    if len(merges) < 2:
        return []

    def validation(arm: str, method: str, score: str = "merged") -> float | None:
        values = [split_average(u, "validation", score) for (m, _), u in merges[arm].items() if m == method]
        return statistics.mean(values) if values else None

    seeds = {a: sorted(seed for m, seed in merges[a] if m == BASELINE) for a in merges}
    baseline = {a: validation(a, BASELINE) for a in merges}
    rank = {a: (len(seeds[a]), -math.inf if baseline[a] is None else baseline[a]) for a in merges}
    rows = []
    for arm in merges:
        others = {m: v for m in METHODS if m != BASELINE and (v := validation(arm, m)) is not None}
        best = max(others, key=others.get, default=None)
        rows.append([arm, seeds_cell(seeds[arm]), *("—" if v is None else f"{v:.2f}" for v in (
            validation(arm, BASELINE, "individual"), baseline[arm])),
                     "—" if best is None else f"`{best}` {others[best]:.2f}"])
    most = max(map(len, seeds.values()))
    chosen = max((a for a in merges if seeds[a] and len(seeds[a]) == most), key=rank.get, default=None)
    reference, title = ("private", f"at ε = {epsilon:g}") if epsilon is not None else ("non_private", "without DP")
    text = [f"## Training settings judged on the merge, {title}" + ("" if tasks == PACKAGED_TASKS else
                                                                     f" on {', '.join(tasks)}"), "",
            "Validation accuracy %, task-averaged, mean over seeds; the chosen arm has task arithmetic's best merged "
            f"validation accuracy among the arms of {most} seed(s): **`{chosen}`**.", "",
            table(["arm", "seeds", "individual (val)", "task arithmetic merged (val)", "best other merge (val)"],
                  rows), ""]
    remedy = max((a for a in merges if a.removeprefix("non_").startswith(DP_MERGING_AXES)), key=rank.get,
                 default=None)
    if remedy is None or reference not in merges:
        return text
    compared = []
    for method in METHODS:
        common = sorted(set.intersection(*({s for m, s in merges[a] if m == method} for a in (remedy, reference))))
        pairs = [(merges[remedy][(method, s)], merges[reference][(method, s)]) for s in common]
        if pairs:
            merged, individual = ([[split_average(u, "test", score) for u in pair] for pair in pairs]
                                  for score in ("merged", "individual"))
            compared.append((method, common, [a - b for a, b in merged], paired_p(*zip(*merged)),
                             statistics.mean(a - b for a, b in individual)))
    adjusted = holm_adjusted([c[3] for c in compared])
    rows = [[m, seeds_cell(common), " ".join(f"{d:+.2f}" for d in diffs), f"{statistics.mean(diffs):+.2f}",
             *p_cells(p, adj), f"{cost:+.2f}"] for (m, common, diffs, p, cost), adj in zip(compared, adjusted)]
    wins = [m for (m, _, diffs, _, cost), adj in zip(compared, adjusted) if adj is not None and adj < ALPHA
            and statistics.mean(diffs) >= TARGET_MERGED_GAIN and -cost <= TARGET_INDIVIDUAL_COST]
    return [*text, f"### DP-Merging's remedy against `{reference}`", "",
            f"The DP-Merging arm (DP-SAM or alignment) of the most seeds and best merged validation accuracy, "
            f"`{remedy}`, minus `{reference}`: task-averaged test accuracy of each method's merge, paired over "
            f"seeds (points), Holm over the methods; and of the individual adapters.", "",
            table(["method", "seeds", "merged − reference per seed", "mean", "p (paired t, seeds)",
                   f"Holm-adjusted p (* < {ALPHA})", "individual − reference (points)"], rows), "",
            f"Default rule (merge ≥ +{TARGET_MERGED_GAIN:g} points, Holm, at ≤ {TARGET_INDIVIDUAL_COST:g} points of "
            "individual accuracy): " + (f"met by `{remedy}` for {', '.join(f'`{m}`' for m in wins)}." if wins
                                        else "not met."), ""]


def geometry(runs: Path, folder: Path, tasks: list[str], settings: dict[str, Any], non_private: bool) -> dict:
    """:data:`GEOMETRY` of the staged ``runs``: each task's drift, sharpness and the merge gap of ``settings``'
    merge (written under ``folder``, removed afterwards), and their task averages."""
    from hf_dpmerge.analysis.diagnostics import diagnose_runs

    config = merge_config(settings["method"], runs / "base", [runs / t / "encoder_adapter" for t in tasks],
                          non_private=non_private, parameters=settings["merge_parameters"])
    merged = folder / "merged" / "geometry"
    run_merge(config, folder / "geometry.yaml", merged, folder / "lora_cache")
    try:
        report = diagnose_runs(runs, merged, tasks, split=settings["split"], max_samples=settings["max_samples"],
                               rho=settings["rho"], hessian_iterations=0, log=lambda line: None)
    finally:
        shutil.rmtree(merged, ignore_errors=True)
    keys = ("drift", "sharpness", "merge_gap")
    return {"tasks": {t.task: {k: t.summary()[k] for k in keys} for t in report.tasks},
            "average": {k: report.averages()[k] for k in keys}}


def geometry_section(units: list[dict[str, Any]]) -> list[str]:
    """Per (arm, ε, tasks): the task-averaged drift, sharpness and merge gap, means over seeds."""
    groups: dict[tuple, list[dict]] = {}
    for unit in units:
        s = unit["settings"]
        groups.setdefault((s["arm"], s["target_epsilon"], tuple(s["tasks"])), []).append(unit)
    if not groups:
        return []
    rows = [[f"`{arm}`" + ("" if epsilon is None else f" ε = {epsilon:g}")
             + ("" if tasks == PACKAGED_TASKS else f" ({', '.join(tasks)})"),
             seeds_cell(sorted(u["settings"]["seed"] for u in found)),
             *(f"{statistics.mean(u['result']['average'][k] for u in found):.4g}"
               for k in ("drift", "sharpness", "merge_gap"))]
            for (arm, epsilon, tasks), found in sorted(groups.items(), key=lambda g: list(ARMS).index(g[0][0]))]
    settings = units[0]["settings"]["geometry"]
    return ["## Geometry: drift and interference", "",
            f"DP-Merging's two quantities (§3.2; `hf-dpmerge diagnose`), on each task's seeded stratified validation "
            f"subset of {settings['max_samples']} rows: drift ‖ΔW‖_F/‖W_0‖_F of each adapter, its sharpness "
            f"L(w + ρ∇L/‖∇L‖) − L(w) at ρ = {settings['rho']:g}, and the merge gap L(w_merge) − L(w_t) of the "
            f"`{settings['method']}` merge (the interference); task averages, means over seeds.", "",
            table(["arm", "seeds", "drift", "sharpness", "merge gap"], rows), ""]


class MergeGain(harness.Study, name="merge_gain", schema=1):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--tasks", default=",".join(PACKAGED_TASKS))
        parser.add_argument("--seeds", default="0,1,2")
        parser.add_argument("--epsilons", default="8", help="the private arms' target ε, comma-separated")
        parser.add_argument("--arms", default="private,non_private",
                            help=f"the merged arms (each brings its floor): {','.join(MERGED_ARMS)}")
        parser.add_argument("--methods", default=",".join(METHODS), help="a subset of the merge methods")

    def plan(self, args: argparse.Namespace) -> list[Unit]:
        """Per seed, its training units (floors other studies stored left out; a stored adapter whose kept folder is
        gone marked to rerun while a merge of it is still missing), then its merges and their geometry."""
        tasks = listed(args.tasks, PACKAGED_TASKS, "--tasks")
        arms, methods = listed(args.arms, MERGED_ARMS, "--arms"), listed(args.methods, METHODS, "--methods")
        epsilons = [float(e) for e in args.epsilons.split(",")]
        store, work_dir, reused = harness.Store(args.units_dir, self.schema), args.work_dir.resolve(), reused_floors()
        units: list[Unit] = []
        for seed in map(int, args.seeds.split(",")):
            training: dict[str, Unit] = {}
            merges: dict[str, Unit] = {}
            for arm in arms:
                for epsilon in epsilons if ARMS[arm].private else [None]:
                    cell_merges = [*(merge_unit(arm, seed, epsilon, m, tasks) for m in methods),
                                   geometry_unit(arm, seed, epsilon, tasks)]
                    pending = any(store.load(u) is None for u in cell_merges)
                    for task in tasks:
                        unit = training_unit(task, arm, seed, epsilon)
                        kept = (kept_run(work_dir, unit) / "encoder_adapter").is_dir()
                        training[unit.name] = Unit(unit.name, unit.settings,
                                                   rerun=pending and not kept and store.load(unit) is not None)
                    for task in tasks:
                        floor = training_unit(task, ARMS[arm].floor, seed, epsilon)
                        if (task, seed, tuple(floor.settings["flags"])) not in reused:
                            training.setdefault(floor.name, floor)
                    merges |= {u.name: u for u in cell_merges}
            units += [*training.values(), *merges.values()]
        return units

    def run(self, unit: Unit, work_dir: Path) -> dict[str, Any]:
        """A training unit (kept unless a floor); a merge: the kept adapters staged afresh, merged (timed) and
        scored; or their geometry."""
        from hf_dpmerge.analysis.evaluation import evaluate_runs
        from hf_dpmerge.analysis.evaluation_report import EvaluationReport

        s = unit.settings
        if "task" in s:
            return train_unit(s["task"], s["flags"], s["seed"], work_dir, unit.name, keep=bool(ARMS[s["arm"]].floor))
        tasks = s["tasks"]
        folder = work_dir / "merges" / f"{cell(s['arm'], s['target_epsilon'])}-seed{s['seed']}"
        shutil.rmtree(folder / "runs", ignore_errors=True)  # never a copy of an adapter retrained since
        runs = stage_runs(folder / "runs", work_dir / "base", {
            t: kept_run(work_dir, training_unit(t, s["arm"], s["seed"], s["target_epsilon"])) for t in tasks})
        if "geometry" in s:
            return geometry(runs, folder, tasks, s["geometry"], non_private=s["target_epsilon"] is None)
        config = merge_config(s["method"], runs / "base", [runs / t / "encoder_adapter" for t in tasks],
                              non_private=s["target_epsilon"] is None, parameters=s["merge_parameters"])
        merged = folder / "merged" / s["method"]
        seconds = timed_merge(config, folder / f"{s['method']}.yaml", merged, folder / "lora_cache")
        fingerprints, scored = run_fingerprints(runs, tasks), {}
        for split in ("test", "validation"):  # the adapters' scores kept beside them for the seed's next merges
            kept = folder / f"adapters-{split}.json"
            known = json.loads(kept.read_text()) if kept.is_file() else {}
            reuse = EvaluationReport.from_dict(known["report"]) if known.get("adapters") == fingerprints else None
            scored[split] = evaluate_runs(runs, merged, tasks, base_dir=runs / "base", split=split, progress=False,
                                          reuse=reuse).to_dict()
            if reuse is None:
                write_text_atomic(kept, json.dumps({"adapters": fingerprints, "report": scored[split]}))
        shutil.rmtree(merged, ignore_errors=True)
        return {"evaluation": scored["test"], "validation": scored["validation"], "merge_seconds": seconds}

    def report(self, stored: list[dict[str, Any]]) -> dict[str, str]:
        """One section per (arm, ε, tasks) of the stored merges, private arms first, against the floors (this
        study's, else the reused ones)."""
        floors = reused_floors() | {(u["settings"]["task"], u["settings"]["seed"], tuple(u["settings"]["flags"])):
                                    100 * u["result"]["test"]["accuracy"] for u in stored
                                    if "task" in u["settings"]}
        groups: dict[tuple[str, float | None, tuple[str, ...]], list[dict]] = {}
        for unit in stored:
            s = unit["settings"]
            if "method" in s and s["arm"] in ARMS:
                groups.setdefault((s["arm"], s["target_epsilon"], tuple(s["tasks"])), []).append(s | unit["result"])

        def arm_scores(arm: str, epsilon: float | None, tasks: tuple[str, ...]) -> dict[str, Scores]:
            wanted = tuple(flags(ARMS[arm].floor, epsilon))
            arm_floors = {(task, seed): score for (task, seed, f), score in floors.items() if f == wanted}
            units = groups.get((arm, epsilon, tasks), [])
            return {m: scores([u for u in units if u["method"] == m], arm_floors) for m in METHODS}

        order = sorted(groups, key=lambda g: (not ARMS[g[0]].private, list(ARMS).index(g[0]), -(g[1] or 0),
                                              g[2] != PACKAGED_TASKS, g[2]))
        sections = [line for arm, epsilon, tasks in order for line in section(
            arm, epsilon, tasks, arm_scores(arm, epsilon, tasks),
            arm_scores(twin(arm), None, tasks) if twin(arm) and epsilon is not None else None)]
        sections += [line for epsilon, tasks in dict.fromkeys((g[1], g[2]) for g in order)
                     for line in search_section(groups, epsilon, tasks)]
        sections += geometry_section([u for u in stored if "geometry" in u["settings"]])
        text = ["# What merges keep of what private adapters add", "",
                f"Generated by `python -m benchmarks.studies.merge_gain --report-only` from {len(stored)} stored "
                "units. Test accuracy %, whole test splits. NAI = (merged − floor) / (individual − floor): the "
                "share of the adapters' gain over the floor that the merge keeps. The seed is the unit (each "
                "retrains every adapter): means over seeds, 95 % t intervals over seeds.", "",
                *(sections or ["No merge unit is stored yet.", ""]),
                "## Arms", "",
                "train_glue.py flags on top of its defaults (`LPFT_RECIPE`, the lpft study's "
                "`k2_b1024_t75_lr1e-2_head6_dpsgd`), shown at ε = 8; merge parameters: `merge_configs/<method>.yaml`"
                " as stored, `dp_aware` with `allow_non_private: true` on non-private adapters.", "",
                *(f"- `{name}`: `{' '.join(flags(name, 8.0))}`" for name in ARMS), ""]
        return {REPORT: "\n".join(text)}


if __name__ == "__main__":
    sys.exit(harness.main(MergeGain()))
