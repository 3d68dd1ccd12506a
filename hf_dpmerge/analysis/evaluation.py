"""Evaluate per-task adapters against the merged model, each task with its own classifier head.

Reads the runs layout of :mod:`hf_dpmerge.analysis.task_run`. For each task, on its test split (or the
validation split, for choices made before the test split is touched), it scores the three models of
:mod:`hf_dpmerge.analysis.task_models` — the floor (the base encoder with the task's own head), the individual
adapter and the merged encoder with the task's head (modulated for the task when the merge is ``emr``:
:mod:`hf_dpmerge.analysis.emr_modulation`) — into the report of :mod:`hf_dpmerge.analysis.evaluation_report`
(gain retained, retention, interference).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from hf_dpmerge.analysis.batching import length_sorted_batches
from hf_dpmerge.analysis.emr_modulation import is_emr_merge, load_modulated_with_head, unified_delta
from hf_dpmerge.analysis.evaluation_report import (
    OWN_HEAD_FLOOR,
    PRIVATE_HEAD_FLOOR,
    EvaluationReport,
    TaskEvaluation,
)
from hf_dpmerge.analysis.merged_origin import check_is_merge, check_merges_runs
from hf_dpmerge.analysis.task_models import load_individual_model, load_merged_with_head, resolve_device
from hf_dpmerge.analysis.task_run import TaskRun, check_model_dirs, find_tokenizer, load_split, task_runs
from hf_dpmerge.data.metrics import (
    compute_metrics,
    predictions_from_logits,
)
from hf_dpmerge.records.run_folders import BASE_DIR

# ---------------------------------------------------------------------------------------------- scoring


@torch.inference_mode()
def predict_logits(model: torch.nn.Module, dataset, tokenizer, batch_size: int = 32,
                   progress: str | None = None) -> np.ndarray:
    """Logits for a tokenized dataset, batched by length (padding is per batch), in dataset order; ``progress``:
    the description of a progress bar over the batches (none when None)."""
    from tqdm.auto import tqdm

    device = next(model.parameters()).device
    outputs = np.empty(len(dataset), dtype=object)
    batches = length_sorted_batches(dataset, tokenizer, batch_size)
    for batch in tqdm(batches, desc=progress, unit="batch", leave=False, disable=progress is None):
        inputs, _ = batch.to(device)
        logits = model(**inputs).logits.float().cpu().numpy()
        for i, row in zip(batch.indices, logits, strict=True):
            outputs[i] = row
    return np.stack(outputs) if len(outputs) else np.zeros((0, 1))


def evaluate_runs(
    runs_dir: str | os.PathLike,
    merged_dir: str | os.PathLike,
    tasks: Sequence[str] | None = None,
    *,
    base_dir: str | os.PathLike | None = None,
    tokenizer=None,
    max_eval_samples: int | None = None,
    split: str = "test",
    max_length: int | None = None,
    data_seed: int | None = None,
    batch_size: int = 32,
    glue_path: str | None = None,
    device: str | torch.device | None = None,
    floor_runs: str | os.PathLike | None = None,
    log=print,
    progress: bool = True,
    reuse: EvaluationReport | None = None,
) -> EvaluationReport:
    """Evaluate ``<runs>/<task>/adapter`` (on ``<runs>/base``) and the merged model on each task's ``split``
    (test by default; validation when the scores select something, e.g. a merge weight).

    ``tasks`` names run folders (default: those the merged model's ``mergekit_config.yml`` merged, else every
    one with an adapter and privacy record); the dataset is
    the task named in the privacy record (the folder name when it has none). Split seed and ``max_length``
    come from the arguments, else the record's ``extra`` (``data_seed``, ``max_length``), else the defaults.
    Models run on ``device`` (default: CUDA when available, else CPU). ``progress`` shows tqdm bars on stderr, per
    task and per batch of each of its three models. ``floor_runs``: a runs folder of head-only releases
    (``--train_lora false``) of the same tasks at the same ε; the floor is then each task's private head (the
    strongest baseline a user could run) and the base encoder with the adapter's own head is kept as ``own_head``.
    ``merged_dir`` must be a merge of the runs scored (:mod:`~hf_dpmerge.analysis.merged_origin`: not the base itself,
    its ``mergekit_config.yml`` merging each of them, every one trained on its base); it is refused before any
    model is scored otherwise. ``reuse``: an earlier report of these same runs (same split, ``max_eval_samples`` and
    floor kind) whose floor and individual scores are kept, so that only the merged model is scored (several
    merges of one runs folder compared); the caller vouches that the adapters are unchanged since.
    """
    runs_dir, merged_dir = Path(runs_dir), Path(merged_dir)
    base_dir = runs_dir / BASE_DIR if base_dir is None else Path(base_dir)
    check_model_dirs(base_dir, merged_dir)
    check_is_merge(base_dir, merged_dir)
    device = resolve_device(device)
    known = reused_scores(reuse, split, max_eval_samples, OWN_HEAD_FLOOR if floor_runs is None else PRIVATE_HEAD_FLOOR)
    results = []
    from tqdm.auto import tqdm

    runs = task_runs(runs_dir, tasks, data_seed=data_seed, max_length=max_length, merged_dir=merged_dir)
    check_merges_runs(runs_dir, base_dir, merged_dir, runs)
    load_merged = load_merged_with_head  # an emr root: each task on its modulated model (the release's)
    if is_emr_merge(merged_dir):
        load_merged = functools.partial(load_modulated_with_head, unified=unified_delta(base_dir, merged_dir))
    for run in tqdm(runs, desc="tasks", unit="task", disable=not progress):
        spec, record = run.spec, run.record
        tok = tokenizer or find_tokenizer([run.adapter_dir, base_dir, merged_dir])
        examples = load_split(run, split, tok, max_samples=max_eval_samples, glue_path=glue_path)
        references = np.asarray(examples["labels"])
        kept = known.get(run.task)
        if kept is not None and kept.num_examples != len(examples):
            raise ValueError(f"reuse: {run.task} was scored on {kept.num_examples} examples, not {len(examples)}")
        own_head = (load_merged_with_head, base_dir, run.adapter_dir)  # the base encoder with the adapter's head
        if floor_runs is None:
            floors = [("floor", *own_head)]
        else:  # the private head: the head-only release on its own base
            private_head = private_head_run(Path(floor_runs), run).adapter_dir
            floors = [("own_head", *own_head), ("floor", load_individual_model, Path(floor_runs) / BASE_DIR,
                                                private_head)]
        adapters = [*floors, ("individual", load_individual_model, base_dir, run.adapter_dir)]
        scores = {} if kept is None else {"floor": kept.floor_metrics, "individual": kept.individual_metrics}
        for kind, loader, directory, adapter_dir in [*(adapters if kept is None else []),
                                                     ("merged", load_merged, merged_dir, run.adapter_dir)]:
            model = loader(directory, adapter_dir, spec).to(device)
            logits = predict_logits(model, examples, tok, batch_size, f"{run.task} {kind}" if progress else None)
            predictions = predictions_from_logits(spec, logits)
            scores[kind] = compute_metrics(spec, predictions, references)
            del model
        epsilon = record.epsilon if record.dp else math.inf
        result = TaskEvaluation(
            task=run.task, metric=spec.metric, epsilon=float(epsilon), delta=record.delta if record.dp else None,
            individual=scores["individual"][spec.metric], merged=scores["merged"][spec.metric],
            num_examples=len(examples), individual_metrics=scores["individual"], merged_metrics=scores["merged"],
            floor=scores["floor"][spec.metric], floor_metrics=scores["floor"],
            own_head=scores["own_head"][spec.metric] if "own_head" in scores else getattr(kept, "own_head", None),
        )
        log(f"{run.task}: floor {result.floor:.4f}, individual {result.individual:.4f}, merged {result.merged:.4f} "
            f"({spec.metric}, n={len(examples)})")
        results.append(result)
    return EvaluationReport(results, merged_model=str(merged_dir), base_model=str(base_dir),
                            max_eval_samples=max_eval_samples, split=split,
                            floor_kind=OWN_HEAD_FLOOR if floor_runs is None else PRIVATE_HEAD_FLOOR)


def reused_scores(reuse: EvaluationReport | None, split: str, max_eval_samples: int | None,
                  floor_kind: str) -> dict[str, TaskEvaluation]:
    """``reuse``'s task evaluations by task (none without it), refused (ValueError) when it scored another split,
    sample cap or floor kind than the evaluation reusing it."""
    if reuse is None:
        return {}
    found, wanted = (reuse.split, reuse.max_eval_samples, reuse.floor_kind), (split, max_eval_samples, floor_kind)
    if found != wanted:
        raise ValueError(f"reuse: the report scored (split, max_eval_samples, floor) = {found}, not {wanted}")
    return {t.task: t for t in reuse.tasks}


def private_head_run(floor_runs: Path, run: TaskRun) -> TaskRun:
    """``run``'s private head in ``floor_runs``: a head-only release (``--train_lora false``) of the same task at
    the same ε (within 1 %) on the same split, else refused naming ``--floor_runs``."""
    (floor,) = task_runs(floor_runs, [run.name], data_seed=run.data_seed, max_length=run.max_length)
    record = floor.record
    problems = []
    if record.extra.get("train_lora", True):
        problems.append("it is not a head-only release (train it with --train_lora false)")
    if floor.task != run.task:
        problems.append(f"it trained on {floor.task!r}, the adapter on {run.task!r}")
    if not math.isclose(record.epsilon, run.record.epsilon, rel_tol=0.01) or record.dp != run.record.dp:
        problems.append(f"its ε = {record.epsilon:.3g}, the adapter's {run.record.epsilon:.3g}")
    if problems:
        raise ValueError(f"--floor_runs {floor_runs}: {run.name}'s private head cannot be its floor: "
                         + "; ".join(problems))
    return floor


# ---------------------------------------------------------------------------------------------- chart
