"""Merging in the studies: a packaged merge config with a study's inputs, ``hf-dpmerge merge``, staged or user's run
folders, and the paper's question as a report: DP-SGD vs DP-Merging adapters of the same seeds, merged by each method.

The report is shared by the encoder (``benchmarks/studies/lpft_merge.py``) and the causal-LM
(``benchmarks/studies/causal_merge.py``) comparisons. A merge unit is ``{"trainer", "seed", "method", "tasks",
"evaluation": {"tasks": {task: {"individual", "merged"}}}}`` (accuracies in [0, 1]); the floor of a (task, seed) is
what the adapters are measured against (the private head for LP-FT, the zero-shot base for a causal LM).

Per method and trainer, means over seeds of the task averages: individual and merged accuracy, interference
(individual − merged, points), retention (merged / individual) and gain retained (merged − floor) /
(individual − floor) on the averaged scores. Per method: DP-Merging − DP-SGD in task-averaged merged accuracy,
paired t over seeds (the seed is the unit: each retrains both trainers' adapters), Holm over the methods.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .markdown import table
from .significance import ALPHA, holm_adjusted, p_cells, paired_p

REPO = Path(__file__).resolve().parent.parent
TRAINERS = ("dp_sgd", "dp_merging")
METHODS = ("task_arithmetic", "ties", "dp_aware", "cauchy_poe")
MERGE_CONFIGS = {"task_arithmetic": "task_arithmetic.yaml", "ties": "ties.yaml", "cauchy_poe": "cauchy_poe.yaml",
                 "dp_aware": "dp.yaml"}
"""Each encoder merge method of the comparisons → its packaged config under ``merge_configs/``."""
DATA_FREE_CONFIGS = {name: f"{name}.yaml" for name in ("tsv", "tsv_no_floor", "iso_c", "iso_c_no_floor", "iso_cts",
                                                         "wudi", "wudi_least_squares", "emr")}
"""The spectral methods' and EMR's packaged configs (merged by the merge_gain study, not by the comparisons), by
name: a config's name is its method's, or the method's with the setting it changes (``tsv_no_floor``: the paper's
TSV-M, no DP noise floor; ``wudi_least_squares``: WUDI's exact minimiser)."""


def packaged_config(merge: str) -> dict[str, Any]:
    """``merge``'s packaged config under ``merge_configs/`` (:data:`MERGE_CONFIGS`, :data:`DATA_FREE_CONFIGS`)."""
    import yaml

    return yaml.safe_load((REPO / "merge_configs" / {**MERGE_CONFIGS, **DATA_FREE_CONFIGS}[merge]).read_text())


def packaged_parameters(merge: str) -> dict[str, Any] | None:
    """The parameters of ``merge``'s packaged config."""
    return packaged_config(merge).get("parameters")


def merge_config(merge: str, base_dir: Path, adapters: list[Path], non_private: bool = False,
                 parameters: dict | None = None) -> dict[str, Any]:
    """``merge``'s packaged config with its base and inputs replaced (its parameters, or ``parameters``); for
    non-private adapters, ``dp_aware`` is told so (``allow_non_private: true``), as it requires."""
    from hf_dpmerge.merging.merge_config import lora_reference, mergekit_config

    template = packaged_config(merge)
    method = template["merge_method"]
    parameters = template.get("parameters") if parameters is None else parameters
    if non_private and method == "dp_aware":
        parameters = {**(parameters or {}), "allow_non_private": True}
    return mergekit_config(method, base_dir, [lora_reference(base_dir, a) for a in adapters], parameters=parameters)


def run_merge(config: dict, config_path: Path, merged: Path, lora_cache: Path) -> None:
    """Write the mergekit ``config`` to ``config_path`` and merge it into ``merged`` with ``hf-dpmerge merge``
    (replacing an earlier output; on the GPU when there is one); raises if the merge fails."""
    import torch
    import yaml

    from hf_dpmerge.cli.main import main as hf_dpmerge

    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    code = hf_dpmerge(["merge", str(config_path), str(merged), "--overwrite", "--quiet",
                       "--lora-merge-cache", str(lora_cache), *(["--cuda"] if torch.cuda.is_available() else [])])
    if code != 0:
        raise RuntimeError(f"hf-dpmerge merge {config_path} failed with exit status {code}")


def timed_merge(config: dict, config_path: Path, merged: Path, lora_cache: Path) -> float:
    """:func:`run_merge`'s wall seconds, mergekit's LoRA cache built first (each base+adapter input folded into
    the base, stale entries dropped, as the merge itself would): the merge alone, comparable between methods on the
    same inputs."""
    from hf_dpmerge.merging.lora_cache import drop_stale_lora_merges
    from hf_dpmerge.merging.run import parse_config

    parsed, _ = parse_config(config)
    drop_stale_lora_merges(parsed, str(lora_cache))
    for reference in parsed.referenced_models():
        reference.merged(cache_dir=str(lora_cache))
    start = time.perf_counter()
    run_merge(config, config_path, merged, lora_cache)
    return time.perf_counter() - start


def stage_runs(runs: Path, base: Path, kept_runs: Mapping[str, Path]) -> Path:
    """``runs``: a link to the shared ``base`` and a copy of each task's kept run folder (checkpoints left out),
    laid out as training wrote them (the adapters name their base as ../../base); staged beside and renamed, so a
    killed copy is redone. An existing ``runs`` is reused."""
    if not runs.is_dir():
        staged = runs.with_name(runs.name + ".tmp")
        shutil.rmtree(staged, ignore_errors=True)
        staged.mkdir(parents=True)
        (staged / "base").symlink_to(base.resolve(), target_is_directory=True)
        for task, kept_run in kept_runs.items():
            shutil.copytree(kept_run, staged / task, ignore=shutil.ignore_patterns("checkpoints*"))
        staged.rename(runs)
    return runs


def run_fingerprints(runs: Path, tasks: list[str] | None = None) -> dict[str, str]:
    """Each task run's adapter fingerprint under ``runs`` (every run by default), in order: what a unit on a user's
    runs folder stores, so that another folder reruns it; a missing or broken run is a usage error (ValueError)."""
    from hf_dpmerge.analysis.task_run import task_runs
    from hf_dpmerge.records.fingerprint import adapter_fingerprint

    try:
        return {run.name: adapter_fingerprint(run.adapter_dir) for run in task_runs(runs, tasks)}
    except FileNotFoundError as error:
        raise ValueError(str(error)) from None


def sweeps(stored: list[dict[str, Any]], *varying: str) -> list[list[dict[str, Any]]]:
    """The stored units grouped by their settings other than ``varying``: one group per sweep, in stored order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for unit in stored:
        key = json.dumps({k: v for k, v in unit["settings"].items() if k not in varying}, sort_keys=True)
        groups.setdefault(key, []).append(unit)
    return list(groups.values())


def task_average(unit: dict, score: str) -> float:
    """A merge unit's ``score`` ('individual' or 'merged') averaged over its tasks, in %."""
    return 100 * statistics.mean(unit["evaluation"]["tasks"][t][score] for t in unit["tasks"])


def floor_average(unit: dict, floors: Mapping[tuple[str, int], float]) -> float:
    """The floors (in %, per (task, seed)) of a merge unit's tasks at its seed, averaged; NaN when one is missing."""
    return statistics.mean(floors.get((t, unit["seed"]), float("nan")) for t in unit["tasks"])


def gain_retained(floor: float, individual: float, merged: float) -> float:
    """(merged − floor) / (individual − floor): the share of the adapters' gain over the floor the merge keeps
    (normalized accuracy improvement); NaN when the adapters do not beat the floor."""
    return (merged - floor) / (individual - floor) if individual > floor else float("nan")


def comparison(units: list[dict], floors: Mapping[tuple[str, int], float], *, title: str, preamble: list[str],
               floor_label: str, footer: str) -> str:
    """The report (markdown) from the stored merge units and each (task, seed)'s floor in %."""
    by = {(u["trainer"], u["seed"], u["method"]): u for u in units}
    seeds = sorted({s for (_, s, _) in by})
    rows = []
    for method in merged_methods(units):
        for trainer in TRAINERS:
            cells = [by[(trainer, s, method)] for s in seeds if (trainer, s, method) in by]
            if not cells:
                continue
            individual = [task_average(c, "individual") for c in cells]
            merged = [task_average(c, "merged") for c in cells]
            floor = [floor_average(c, floors) for c in cells]
            ind, mer, fl = statistics.mean(individual), statistics.mean(merged), statistics.mean(floor)
            gain = gain_retained(fl, ind, mer)
            rows.append([method, trainer, ",".join(str(c["seed"]) for c in cells), f"{fl:.1f}", f"{ind:.1f}",
                         f"{mer:.1f}", f"{ind - mer:+.2f}", f"{100 * mer / ind:.1f}",
                         f"below {floor_label}" if gain != gain else f"{100 * gain:.0f} %"])
    comparisons = [[row["method"], ",".join(map(str, row["seeds"])), " ".join(f"{d:+.2f}" for d in row["differences"]),
                    f"{statistics.mean(row['differences']):+.2f}", *p_cells(row["p"], row["holm"])]
                   for row in trainer_differences(units)]
    text = [f"# {title}", "", *preamble, "",
            "## Per method and trainer", "",
            table(["method", "trainer", "seeds", floor_label, "individual", "merged",
                            "interference (points)", "retention %", "gain retained"], rows), "",
            "## DP-Merging − DP-SGD, task-averaged merged accuracy (points)", "",
            table(["method", "seeds", "per seed", "mean", "p (paired t, seeds)",
                            f"Holm-adjusted p (* < {ALPHA})"], comparisons), "",
            footer, ""]
    return "\n".join(text)


def merged_methods(units: list[dict]) -> list[str]:
    """The methods the comparisons report: :data:`METHODS` first, then any other the units merged."""
    return list(dict.fromkeys([*METHODS, *(u["method"] for u in units)]))


def trainer_differences(units: list[dict]) -> list[dict[str, Any]]:
    """Per method (:func:`merged_methods`): DP-Merging − DP-SGD in task-averaged merged
    accuracy on the seeds both trainers merged (points, per seed), the paired t p-value (None below two seeds) and
    its Holm adjustment over the methods."""
    by = {(u["trainer"], u["seed"], u["method"]): u for u in units}
    seeds = sorted({s for (_, s, _) in by})
    rows = []
    for method in merged_methods(units):
        paired = [s for s in seeds if all((tr, s, method) in by for tr in TRAINERS)]
        if paired:
            ours, theirs = ([task_average(by[(tr, s, method)], "merged") for s in paired]
                            for tr in ("dp_merging", "dp_sgd"))
            rows.append({"method": method, "seeds": paired, "differences": [a - b for a, b in zip(ours, theirs)],
                         "p": paired_p(ours, theirs)})
    for row, adjusted in zip(rows, holm_adjusted([row["p"] for row in rows])):
        row["holm"] = adjusted
    return rows


def trainer_evidence(units: list[dict], floors: Mapping[tuple[str, int], float]) -> dict[str, Any]:
    """The paper's question as ``hf-dpmerge recommend`` cites it: the tasks, the seeds every method paired, each
    trainer's task-averaged individual accuracy and the floor (%, means over those seeds), and per method the mean
    DP-Merging − DP-SGD merged difference (points) with its p-value and Holm adjustment
    (:func:`trainer_differences`)."""
    rows = trainer_differences(units)
    seeds = sorted(set.intersection(*(set(row["seeds"]) for row in rows))) if rows else []
    first = {(u["trainer"], u["seed"]): u for u in reversed(units)}  # any merge holds its seed's individual scores
    return {"tasks": list(units[0]["tasks"]) if units else [], "seeds": seeds,
            "individual": {tr: round(statistics.mean(task_average(first[(tr, s)], "individual") for s in seeds), 2)
                           for tr in TRAINERS} if seeds else {},
            "floor": round(statistics.mean(floor_average(first[("dp_sgd", s)], floors) for s in seeds), 2)
            if seeds else None,
            "methods": {row["method"]: {"difference": round(statistics.mean(row["differences"]), 2),
                                        "p": row["p"], "holm": row["holm"]} for row in rows}}
