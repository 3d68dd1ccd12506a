"""Private merge tuning: merge every candidate of a grid, score it on private validation data, select privately.

Candidates are a base mergekit config with grid values substituted (``lambda=0.3,0.6`` sets the top-level
``parameters.lambda``; ``1.weight=0.5,1`` sets ``models[1].parameters.weight``; the Cartesian product of all
grids). Each candidate is merged with mergekit's ``run_merge`` (our guarded one), each task's head is put
on the merged encoder (:mod:`hf_dpmerge.analysis.task_models`) and its validation accuracy counted. One
candidate is chosen by an ε-DP mechanism over the task-averaged accuracy (:mod:`hf_dpmerge.records.
private_selection`); the chosen merge is kept with a ``dp_selection.json`` that composes ε_sel with the
adapters' records (:mod:`hf_dpmerge.records.selection_record`); its README's privacy section and the card of
``hf-dpmerge push`` state that composed total as the one guarantee. The scores themselves never leave this module.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from hf_dpmerge.analysis.evaluation import predict_logits
from hf_dpmerge.analysis.runs_layout import TaskRun, find_tokenizer, load_split
from hf_dpmerge.analysis.task_models import load_merged_with_head, resolve_device
from hf_dpmerge.data.metrics import predictions_from_logits
from hf_dpmerge.merging.config_edit import with_parameter
from hf_dpmerge.records.private_selection import accuracy_sensitivity, select_private
from hf_dpmerge.records.selection_record import SelectionRecord, composed_guarantee

UTILITY = "validation accuracy averaged over tasks, denominators fixed at the validation sizes"


@dataclass(frozen=True)
class GridAxis:
    """One ``--grid`` entry: a parameter (top level, or of input ``model_index``) and the values it takes."""

    name: str
    model_index: int | None
    values: tuple[Any, ...]

    @property
    def label(self) -> str:
        return self.name if self.model_index is None else f"models[{self.model_index}].{self.name}"

    @classmethod
    def parse(cls, text: str) -> GridAxis:
        """``NAME=v1,v2,…`` or ``I.NAME=v1,v2,…`` (I: 0-based index into ``models:``); values are YAML scalars."""
        key, sep, values = text.partition("=")
        index_text, dot, name = key.strip().rpartition(".")
        if not sep or not name or not values.strip() or (dot and not index_text.isdigit()):
            raise ValueError(f"--grid {text!r}: expected NAME=v1,v2 or MODEL_INDEX.NAME=v1,v2 (e.g. lambda=0.3,0.6)")
        parsed = tuple(yaml.safe_load(v) for v in values.split(","))
        return cls(name, int(index_text) if dot else None, parsed)


def candidate_configs(config: dict[str, Any], grid: Sequence[GridAxis]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(settings, config) for every point of the Cartesian product of ``grid``, in row-major order."""
    labels = [axis.label for axis in grid]
    if len(set(labels)) != len(labels):
        raise ValueError(f"--grid names a parameter twice: {labels}")
    candidates = []
    for values in itertools.product(*(axis.values for axis in grid)):
        candidate = config
        for axis, value in zip(grid, values, strict=True):
            candidate = with_parameter(candidate, axis.name, value, axis.model_index)
        candidates.append((dict(zip(labels, values, strict=True)), candidate))
    if len(candidates) < 2:
        raise ValueError("the grid gives fewer than 2 candidate merges: nothing to select; give more --grid values")
    return candidates


def merge_candidate(config: dict[str, Any], out_dir: Path, lora_merge_cache: str | None, device: str | None) -> Path:
    """Merge one candidate config into ``out_dir`` with mergekit (hf_dpmerge's checks and atomic output)."""
    import mergekit.merge
    from mergekit.config import MergeConfiguration
    from mergekit.options import MergeOptions

    from hf_dpmerge.merging.registration import activate

    activate()
    source = yaml.safe_dump(config, sort_keys=False)
    options = MergeOptions(lora_merge_cache=lora_merge_cache, quiet=True, device=device or "cpu")
    mergekit.merge.run_merge(MergeConfiguration.model_validate(config), str(out_dir), options=options,
                             config_source=source)
    return out_dir


def correct_counts(merged_dir: Path, runs: Sequence[TaskRun], validation: dict[str, Any], tokenizer,
                   batch_size: int, device) -> dict[str, int]:
    """Per task: how many validation examples the merged encoder with the task's head classifies correctly."""
    counts = {}
    for run in runs:
        model = load_merged_with_head(merged_dir, run.adapter_dir, run.spec).to(device)
        data = validation[run.name]
        predictions = predictions_from_logits(run.spec, predict_logits(model, data, tokenizer, batch_size))
        counts[run.name] = int(np.sum(np.asarray(predictions) == np.asarray(data["labels"])))
        del model
    return counts


def task_averaged_accuracy(counts: dict[str, int], sizes: dict[str, int]) -> float:
    """u = (1/T)·Σ_t c_t / n_t."""
    return float(np.mean([counts[task] / sizes[task] for task in sizes]))


def tune_merge(
    config: dict[str, Any],
    grid: Sequence[GridAxis],
    runs: Sequence[TaskRun],
    output_dir: str | os.PathLike,
    *,
    epsilon: float,
    mechanism: str,
    composition: str,
    base_dir: Path,
    lora_merge_cache: str | None = None,
    batch_size: int = 32,
    device: str | None = None,
    rng: np.random.Generator | None = None,
    log: Callable[[str], None] = print,
) -> SelectionRecord:
    """Merge and score every candidate, select one ε-DP, keep it at ``output_dir`` with its selection record."""
    from mergekit.config import MergeConfiguration

    from hf_dpmerge.merging.output_dir import check_merge_output
    from hf_dpmerge.merging.privacy_section import write_privacy_section

    output_dir = Path(output_dir)
    if regression := [run.name for run in runs if run.spec.is_regression]:
        raise ValueError(f"tune scores accuracy; {regression} are regression tasks: leave them out of --tasks")
    check_merge_output(str(output_dir), False)
    candidates = candidate_configs(config, grid)
    records = {run.name: run.record for run in runs}
    total_epsilon, total_delta = composed_guarantee(records, epsilon, composition)  # refuses a bad --composition
    torch_device = resolve_device(device)
    tokenizer = find_tokenizer([runs[0].adapter_dir, base_dir])
    validation = {run.name: load_split(run, "validation", tokenizer) for run in runs}
    sizes = {name: len(data) for name, data in validation.items()}
    sensitivity = accuracy_sensitivity(list(sizes.values()))
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.candidates-", dir=output_dir.parent))
    try:
        utilities = []
        for index, (settings, candidate) in enumerate(candidates):
            log(f"candidate {index + 1}/{len(candidates)}: {settings}")
            merged = merge_candidate(candidate, scratch / str(index), lora_merge_cache, device)
            utilities.append(task_averaged_accuracy(
                correct_counts(merged, runs, validation, tokenizer, batch_size, torch_device), sizes))
        chosen = select_private(utilities, epsilon, sensitivity, mechanism, rng or np.random.default_rng())
        record = SelectionRecord(
            mechanism=mechanism, epsilon=epsilon, sensitivity=sensitivity, utility=UTILITY,
            relation="addition, removal or replacement", unit="validation example", composition=composition,
            candidates=[settings for settings, _ in candidates], chosen=chosen, validation_sizes=sizes,
            adapters={name: {"epsilon": r.epsilon if r.dp else float("inf"), "delta": r.delta}
                      for name, r in records.items()},
            total_epsilon=total_epsilon, total_delta=total_delta,
        )
        record.save(scratch / str(chosen))
        write_privacy_section(scratch / str(chosen), MergeConfiguration.model_validate(candidates[chosen][1]), record)
        os.replace(scratch / str(chosen), output_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return record
