"""Private merge tuning: merge every candidate of a grid, score it on private validation data, select privately.

Candidates are a base mergekit config with grid values substituted (``lambda=0.3,0.6`` sets the top-level
``parameters.lambda``; ``1.weight=0.5,1`` sets ``models[1].parameters.weight``; the Cartesian product of all
grids). Each candidate is merged by :func:`hf_dpmerge.merging.run.merge`, each task's head is put
on the merged encoder (:mod:`hf_dpmerge.analysis.task_models`; a merged causal LM answers by its verbalisers'
likelihood, :mod:`hf_dpmerge.analysis.causal_evaluation`) and its accuracy counted on a uniform random
subsample of the task's validation set of the public size n_t (``--validation_size``; one subsample for all
candidates; a user-level adapter's task first keeps at most ``--rows_per_unit`` rows of each privacy unit). One
candidate is chosen by an ε-DP mechanism over the task-averaged accuracy
(:mod:`hf_dpmerge.training.dp.private_selection`); the chosen merge is kept with a ``dp_selection.json`` that
composes ε_sel with the adapters' records and holds each adapter's fingerprint
(:mod:`hf_dpmerge.records.selection_record`); its README's privacy section and the card of ``hf-dpmerge push``
state that composed total as the one guarantee, for those adapters only.
The scores and the private validation set sizes never leave this module.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from hf_dpmerge.analysis.causal_evaluation import task_predictions
from hf_dpmerge.analysis.evaluation import predict_logits
from hf_dpmerge.analysis.task_models import load_merged_with_head, resolve_device
from hf_dpmerge.analysis.task_run import TaskRun, find_tokenizer, load_split, task_rows
from hf_dpmerge.data.metrics import predictions_from_logits
from hf_dpmerge.data.tokenize import MissingColumnError
from hf_dpmerge.merging.config_edit import with_parameter
from hf_dpmerge.records.fingerprint import adapter_fingerprint
from hf_dpmerge.records.record import EXAMPLE_UNIT
from hf_dpmerge.records.selection_record import SelectionRecord, composed_guarantee, selection_unit
from hf_dpmerge.training.dp.private_selection import (
    DEFAULT_VALIDATION_SIZE,
    accuracy_sensitivity,
    select_private,
    subsample_indices,
    task_averaged_accuracy,
    unit_capped_indices,
)

UTILITY = ("task-averaged validation accuracy, each task's correct predictions on n of its validation examples "
           "drawn uniformly at random (missing ones counted wrong) over n")
RELATION = "addition, removal or replacement"  # each bounded directly (docs/design.md §13)


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
    """Merge one candidate config into ``out_dir`` (:func:`hf_dpmerge.merging.run.merge`: its checks and atomic
    output)."""
    from mergekit.options import MergeOptions

    from hf_dpmerge.merging.run import merge

    options = MergeOptions(lora_merge_cache=lora_merge_cache, quiet=True, device=device or "cpu")
    return merge(config, out_dir, options=options)


def correct_counts(merged_dir: Path, runs: Sequence[TaskRun], validation: dict[str, Any], tokenizer,
                   batch_size: int, device) -> dict[str, int]:
    """Per task: how many validation examples the merged model classifies correctly: the merged encoder with the
    task's head, or the merged causal LM by its verbalisers' likelihood (one model for every causal task)."""
    counts, causal_lm = {}, None
    for run in runs:
        data = validation[run.name]
        if run.is_causal_lm:
            if causal_lm is None:
                from transformers import AutoModelForCausalLM

                causal_lm = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).to(device).eval()
            predictions = task_predictions(causal_lm, tokenizer, run.spec, data, run.max_length, batch_size,
                                           answer_end=run.record.answer_end_trained)
            labels = data["label"]
        else:
            model = load_merged_with_head(merged_dir, run.adapter_dir, run.spec).to(device)
            predictions = predictions_from_logits(run.spec, predict_logits(model, data, tokenizer, batch_size))
            labels = data["labels"]
            del model
        counts[run.name] = int(np.sum(np.asarray(predictions) == np.asarray(labels)))
    return counts


def parse_validation_size(text: str) -> int | dict[str, int]:
    """``--validation_size``: ``N`` (every task) or ``TASK=N,TASK=N`` (one per task)."""
    try:
        if "=" not in text:
            return int(text)
        pairs = [item.split("=") for item in text.split(",")]
        sizes = {task.strip(): int(n) for task, n in pairs}
        if len(sizes) != len(pairs):
            raise ValueError
        return sizes
    except ValueError:
        raise ValueError(f"--validation_size {text!r}: expected N or TASK=N,TASK=N (e.g. 500)") from None


def public_validation_size(validation_size: int | Mapping[str, int], tasks: Sequence[str]) -> dict[str, int]:
    """The public n_t of every task in ``tasks``; refuses a missing or unknown task and n_t < 1."""
    sizes = (dict(validation_size) if isinstance(validation_size, Mapping)
             else dict.fromkeys(tasks, validation_size))
    if set(sizes) != set(tasks):
        raise ValueError(f"--validation_size names {sorted(sizes)} but the tasks are {sorted(tasks)}; give one "
                         "size for every task, or one number for all")
    if not all(isinstance(n, int) and n >= 1 for n in sizes.values()):
        raise ValueError(f"--validation_size must be a whole number ≥ 1 for every task, got {sizes}")
    return {task: sizes[task] for task in tasks}


def scoring_sets(validation: Mapping[str, Any], validation_size: Mapping[str, int], rng: np.random.Generator,
                 unit_columns: Mapping[str, str | None] | None = None, rows_per_unit: int = 1) -> dict[str, Any]:
    """Each task's validation set subsampled uniformly at random to min(n_t, |D_t|) examples; a task with a unit
    column (``unit_columns``) keeps at most ``rows_per_unit`` rows of each unit first
    (:func:`~hf_dpmerge.training.dp.private_selection.unit_capped_indices`), and the column is dropped."""
    sets = {}
    for task, data in validation.items():
        column = (unit_columns or {}).get(task)
        if column is None:
            sets[task] = data.select(subsample_indices(len(data), validation_size[task], rng))
            continue
        rows = unit_capped_indices(list(data[column]), rows_per_unit, validation_size[task], rng.random(len(data)))
        sets[task] = data.select(rows).remove_columns(column)
    return sets


def validation_split(run: TaskRun, tokenizer) -> Any:
    """The run's validation split: tokenized as in training for a classifier, its rows as loaded for a causal LM
    (prompts are built when scoring), with the adapter's privacy unit column when it is user-level; refused when
    that column is missing (a selection on it could not bound one unit's rows)."""
    column = run.record.unit_column
    try:
        if run.is_causal_lm:
            rows = task_rows(run, "validation")
            if column is not None and column not in rows.column_names:
                raise MissingColumnError(column)
            return rows
        return load_split(run, "validation", tokenizer, keep_columns=() if column is None else (column,))
    except MissingColumnError:
        raise ValueError(
            f"{run.name}: its adapter's guarantee is per {run.record.privacy_unit} (user-level), but its validation "
            f"split has no column {column!r}, so a private selection on it cannot bound what one unit's rows "
            f"change: leave {run.name} out of --tasks, or give it validation data holding {column!r}"
        ) from None


@dataclass
class ScoringSetup:
    """What every candidate of a private selection is scored with: the runs, their validation subsamples of public
    sizes n_t, the sensitivity Δ of the utility, the adapters' records and the composed total; ``seeded``: whether
    a fixed seed drew the subsamples and the selection; ``units``: each task's privacy unit (its adapter's), of
    which at most ``rows_per_unit`` validation rows were scored; ``fingerprints``: each task's
    :func:`~hf_dpmerge.records.fingerprint.adapter_fingerprint` (a release of other adapters is refused)."""

    runs: Sequence[TaskRun]
    validation_size: dict[str, int]
    validation: dict[str, Any]
    tokenizer: Any
    sensitivity: float
    records: dict[str, Any]
    epsilon: float
    composition: str
    total_epsilon: float
    total_delta: float
    device: Any
    batch_size: int
    seeded: bool
    units: dict[str, str]
    rows_per_unit: int
    fingerprints: dict[str, str]

    def utility(self, merged_dir: Path) -> float:
        """The task-averaged validation accuracy of a merged candidate (its scores stay in this process)."""
        counts = correct_counts(merged_dir, self.runs, self.validation, self.tokenizer, self.batch_size, self.device)
        return task_averaged_accuracy(counts, self.validation_size)

    def selection_record(self, mechanism: str, candidates: list[dict[str, Any]], chosen: int,
                         extra: dict[str, Any] | None = None) -> SelectionRecord:
        """The record of choosing ``candidates[chosen]`` with ``mechanism`` at this setup's ε_sel."""
        per_unit = any(unit != EXAMPLE_UNIT for unit in self.units.values())
        utility = UTILITY + (f"; a user-level task's rows drawn at most {self.rows_per_unit} per privacy unit first"
                             if per_unit else "")
        return SelectionRecord(
            mechanism=mechanism, epsilon=self.epsilon, sensitivity=self.sensitivity, utility=utility,
            relation=RELATION, unit=selection_unit(self.units, self.rows_per_unit), composition=self.composition,
            candidates=candidates, chosen=chosen, validation_size=self.validation_size, units=dict(self.units),
            rows_per_unit=self.rows_per_unit, fingerprints=dict(self.fingerprints),
            adapters={name: {"epsilon": r.epsilon if r.dp else float("inf"), "delta": r.delta}
                      for name, r in self.records.items()},
            total_epsilon=self.total_epsilon, total_delta=self.total_delta, seeded=self.seeded,
            extra=dict(extra or {}),
        )


def prepare_scoring(runs: Sequence[TaskRun], output_dir: Path, *, epsilon: float, composition: str,
                    base_dir: Path, validation_size: int | Mapping[str, int], batch_size: int, device: str | None,
                    rng: np.random.Generator, seeded: bool, command: str, rows_per_unit: int = 1) -> ScoringSetup:
    """Checks before any merge (classification tasks, public sizes, a free output, a known composition, the unit
    column of a user-level adapter's validation split), then the validation subsamples drawn with ``rng``
    (``seeded``: from a fixed seed; at most ``rows_per_unit`` rows of one privacy unit)."""
    from hf_dpmerge.merging.run import check_merge_output

    if regression := [run.name for run in runs if run.spec.is_regression]:
        raise ValueError(f"{command} scores accuracy; {regression} are regression tasks: leave them out of --tasks")
    if len({run.is_causal_lm for run in runs}) > 1:
        causal = [run.name for run in runs if run.is_causal_lm]
        raise ValueError(f"{command}: {causal} are causal-LM runs and the others classifiers; one merge cannot hold "
                         "both: choose --tasks of one kind")
    size = public_validation_size(validation_size, [run.name for run in runs])
    check_merge_output(str(output_dir), False)
    records = {run.name: run.record for run in runs}
    total_epsilon, total_delta = composed_guarantee(records, epsilon, composition)  # refuses a bad --composition
    if not (isinstance(rows_per_unit, int) and rows_per_unit >= 1):
        raise ValueError(f"--rows_per_unit must be a whole number ≥ 1, got {rows_per_unit}")
    tokenizer = find_tokenizer([runs[0].adapter_dir, base_dir])
    unit_columns = {run.name: run.record.unit_column for run in runs}
    validation = scoring_sets({run.name: validation_split(run, tokenizer) for run in runs}, size, rng, unit_columns,
                              rows_per_unit)
    sensitivity = accuracy_sensitivity(list(size.values()),
                                       [1 if unit_columns[task] is None else rows_per_unit for task in size])
    return ScoringSetup(runs, size, validation, tokenizer, sensitivity, records, epsilon, composition, total_epsilon,
                        total_delta, resolve_device(device), batch_size, seeded,
                        {run.name: run.record.privacy_unit for run in runs}, rows_per_unit,
                        {run.name: adapter_fingerprint(run.adapter_dir) for run in runs})


def keep_chosen(merged_dir: Path, output_dir: Path, config: dict[str, Any], record: SelectionRecord) -> None:
    """Put the chosen candidate's merge at ``output_dir`` with its selection record and restated privacy section."""
    from mergekit.config import MergeConfiguration

    from hf_dpmerge.merging.privacy_section import write_privacy_section

    record.save(merged_dir)
    write_privacy_section(merged_dir, MergeConfiguration.model_validate(config), record)
    os.replace(merged_dir, output_dir)


@contextmanager
def candidate_scratch(output_dir: Path) -> Iterator[Path]:
    """A scratch folder beside ``output_dir`` for the candidates' merges, removed afterwards whatever happens."""
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.candidates-", dir=output_dir.parent))
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


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
    validation_size: int | Mapping[str, int] = DEFAULT_VALIDATION_SIZE,
    rows_per_unit: int = 1,
    lora_merge_cache: str | None = None,
    batch_size: int = 32,
    device: str | None = None,
    seed: int | None = None,
    log: Callable[[str], None] = print,
) -> SelectionRecord:
    """Merge and score every candidate, select one ε-DP, keep it at ``output_dir`` with its selection record.

    ``validation_size``: the public n_t (one for all tasks, or per task); ``rows_per_unit``: the public m, most
    validation rows scored per privacy unit of a user-level adapter's task (Δ = m/(T·n_t)); ``seed`` seeds the
    subsamples and the selection (default: OS entropy). A fixed seed makes the selection non-private against
    whoever knows it: the record says ``seeded: true`` and ``hf-dpmerge push`` refuses it unless
    ``--allow-seeded``.
    """
    output_dir = Path(output_dir)
    rng = np.random.default_rng(seed)
    candidates = candidate_configs(config, grid)
    setup = prepare_scoring(runs, output_dir, epsilon=epsilon, composition=composition, base_dir=base_dir,
                            validation_size=validation_size, batch_size=batch_size, device=device, rng=rng,
                            seeded=seed is not None, command="tune", rows_per_unit=rows_per_unit)
    with candidate_scratch(output_dir) as scratch:
        utilities = []
        for index, (settings, candidate) in enumerate(candidates):
            log(f"candidate {index + 1}/{len(candidates)}: {settings}")
            utilities.append(setup.utility(merge_candidate(candidate, scratch / str(index), lora_merge_cache, device)))
        chosen = select_private(utilities, epsilon, setup.sensitivity, mechanism, rng)
        record = setup.selection_record(mechanism, [settings for settings, _ in candidates], chosen)
        keep_chosen(scratch / str(chosen), output_dir, candidates[chosen][1], record)
    return record
