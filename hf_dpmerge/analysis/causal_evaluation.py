"""Evaluate causal-LM adapters, the zero-shot base and the merged LM on each task's test split.

Each model predicts the label whose verbaliser is most likely after the prompt
(:mod:`hf_dpmerge.modeling.verbaliser_scoring`; the end of sequence left out for every model of a task whose adapter
was trained without it), scored by the task's primary metric, or by completion token accuracy on a prompt →
completion task. Per task: the floor f (the base zero-shot), individual a (base + the task's adapter), merged m,
retention = m/a and gain retained = (m − f)/(a − f) (undefined when a ≤ f); averages are unweighted means over
tasks of the defined values. See docs/design.md §14 and docs/causal-lm.md.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hf_dpmerge.analysis.evaluation_report import mean_of_defined
from hf_dpmerge.analysis.merged_origin import check_is_merge, check_merges_runs
from hf_dpmerge.analysis.task_models import resolve_device
from hf_dpmerge.analysis.task_run import check_model_dirs, task_rows, task_runs
from hf_dpmerge.data.completions import completion_rows
from hf_dpmerge.data.instructions import verbaliser_choices
from hf_dpmerge.data.metrics import compute_metrics
from hf_dpmerge.data.tasks import TaskSpec
from hf_dpmerge.modeling.completion_scoring import completion_token_accuracy
from hf_dpmerge.modeling.verbaliser_scoring import verbaliser_predictions
from hf_dpmerge.records.record import CAUSAL_LM
from hf_dpmerge.records.run_folders import BASE_DIR
from hf_dpmerge.utils.quiet import expected_warnings_ignored

RESULTS_NAME = "results.json"
SCORED = ("floor", "individual", "merged")


def is_causal_lm_dir(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` holds a causal LM checkpoint (``config.json`` architectures ``*ForCausalLM``)."""
    config = Path(directory) / "config.json"
    if not config.is_file():
        return False
    architectures = json.loads(config.read_text(encoding="utf-8")).get("architectures") or []
    return any(name.endswith("ForCausalLM") for name in architectures)


def task_predictions(model: torch.nn.Module, tokenizer, spec: TaskSpec, dataset, max_length: int,
                     batch_size: int = 16, answer_end: bool = True) -> np.ndarray:
    """``model``'s label for each row of a loaded split: the one whose verbaliser is most likely after the prompt
    (with the end-of-sequence token after it unless ``answer_end`` is false)."""
    prompts, responses = verbaliser_choices(dataset, spec, tokenizer, max_length, answer_end=answer_end)
    return np.asarray(verbaliser_predictions(model, prompts, responses, pad_token_id=tokenizer.pad_token_id or 0,
                                             batch_size=batch_size))


def task_score(model: torch.nn.Module, tokenizer, spec: TaskSpec, dataset, max_length: int,
               batch_size: int = 16, answer_end: bool = True) -> float:
    """The task's primary metric of ``model``'s verbaliser predictions on a loaded split (``label`` column); for a
    prompt → completion task, its completion token accuracy (:mod:`hf_dpmerge.modeling.completion_scoring`)."""
    if spec.is_generative:
        return completion_token_accuracy(model, completion_rows(dataset, tokenizer, max_length, answer_end),
                                         pad_token_id=tokenizer.pad_token_id or 0, batch_size=batch_size)
    predictions = task_predictions(model, tokenizer, spec, dataset, max_length, batch_size, answer_end)
    return compute_metrics(spec, predictions, np.asarray(dataset["label"]))[spec.metric]


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else math.nan


@dataclass
class CausalTaskEvaluation:
    """One task's scores (its primary ``metric``): zero-shot floor, own adapter, merged LM."""

    task: str
    metric: str
    epsilon: float
    floor: float
    individual: float
    merged: float
    num_examples: int
    answer_end_scored: bool = True

    @property
    def retention(self) -> float:
        """merged / individual (NaN when individual ≤ 0)."""
        return _ratio(self.merged, self.individual)

    @property
    def gain_retained(self) -> float:
        """(merged − floor) / (individual − floor) (NaN when the adapter does not beat the floor)."""
        return _ratio(self.merged - self.floor, self.individual - self.floor)


@dataclass
class CausalEvaluationReport:
    """Per-task evaluations of causal-LM runs; averages are unweighted over tasks."""

    tasks: list[CausalTaskEvaluation]
    merged_model: str
    base_model: str
    max_eval_samples: int | None = None
    split: str = "test"

    def averages(self) -> dict[str, float | None]:
        names = (*SCORED, "retention", "gain_retained")
        return {name: mean_of_defined([getattr(t, name) for t in self.tasks]) for name in names}

    def to_dict(self) -> dict[str, Any]:
        def defined(value: float) -> float | None:
            return None if math.isnan(value) else value

        return {
            "model_kind": CAUSAL_LM,
            "tasks": {t.task: {**asdict(t), "retention": defined(t.retention),
                               "gain_retained": defined(t.gain_retained)} for t in self.tasks},
            "average": self.averages(),
            "max_epsilon": max((t.epsilon for t in self.tasks), default=None),
            "merged_model": self.merged_model,
            "base_model": self.base_model,
            "max_eval_samples": self.max_eval_samples,
            "split": self.split,
            "definitions": {
                "floor": "the base causal LM zero-shot (verbaliser scoring, no adapter)",
                "retention": "merged / individual (primary metric; null when individual <= 0)",
                "gain_retained": "(merged - floor) / (individual - floor) (null when individual <= floor)",
                "epsilon": "recorded epsilon of the task's adapter (Infinity = non-private)",
                "answer_end_scored": "whether each response's end-of-sequence token is scored (false where the task's "
                                     "adapter was trained without it: the verbaliser's tokens alone, for every model)",
            },
        }

    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``results.json`` into ``directory``; return its path."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / RESULTS_NAME
        path.write_text(json.dumps(self.to_dict(), indent=2, allow_nan=True) + "\n")
        return path

    def table(self) -> str:
        """A plain-text table of every task and the averages."""
        def cell(value: float | None, spec: str) -> str:
            return "–" if value is None or math.isnan(value) else format(value, spec)

        header = (f"{'task':<18} {'ε':>6} {'floor':>8} {'individual':>10} {'merged':>8} {'retention':>9} "
                  f"{'gain kept':>9}")
        lines = [header, "-" * len(header)]
        for t in self.tasks:
            eps = "∞" if math.isinf(t.epsilon) else f"{t.epsilon:.2f}"
            name = t.task if t.answer_end_scored else f"{t.task} †"
            lines.append(f"{name:<18} {eps:>6} {t.floor:>8.4f} {t.individual:>10.4f} {t.merged:>8.4f} "
                         f"{cell(t.retention, '.1%'):>9} {cell(t.gain_retained, '.1%'):>9}")
        avg = self.averages()
        lines.append(f"{'average':<18} {'':>6} {cell(avg['floor'], '.4f'):>8} {cell(avg['individual'], '.4f'):>10} "
                     f"{cell(avg['merged'], '.4f'):>8} {cell(avg['retention'], '.1%'):>9} "
                     f"{cell(avg['gain_retained'], '.1%'):>9}")
        if not all(t.answer_end_scored for t in self.tasks):
            lines.append("† scored on the verbaliser's tokens alone: its adapter was trained without the answer's end")
        return "\n".join(lines)


def evaluate_causal_runs(
    runs_dir: str | os.PathLike,
    merged_dir: str | os.PathLike,
    tasks: Sequence[str] | None = None,
    *,
    base_dir: str | os.PathLike | None = None,
    max_eval_samples: int | None = None,
    split: str = "test",
    max_length: int | None = None,
    data_seed: int | None = None,
    batch_size: int = 16,
    device: str | torch.device | None = None,
    log=print,
) -> CausalEvaluationReport:
    """Score the zero-shot base, each ``<runs>/<task>/adapter`` on it and the merged LM on each task's ``split``
    (tasks, split seed and ``max_length`` resolved as :func:`hf_dpmerge.analysis.task_run.task_runs` does),
    with the base's tokenizer (the one training used)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    runs_dir, merged_dir = Path(runs_dir), Path(merged_dir)
    base_dir = runs_dir / BASE_DIR if base_dir is None else Path(base_dir)
    check_model_dirs(base_dir, merged_dir)
    check_is_merge(base_dir, merged_dir)
    device = resolve_device(device)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    runs = task_runs(runs_dir, tasks, data_seed=data_seed, max_length=max_length, merged_dir=merged_dir)
    check_merges_runs(runs_dir, base_dir, merged_dir, runs)
    splits = {run.name: task_rows(run, split, max_samples=max_eval_samples) for run in runs}
    scores: dict[str, dict[str, float]] = {run.name: {} for run in runs}

    def score_all(kind: str, model: torch.nn.Module, only=None) -> None:
        model.to(device).eval()
        for run in runs if only is None else [only]:
            scores[run.name][kind] = task_score(model, tokenizer, run.spec, splits[run.name], run.max_length,
                                                batch_size, answer_end=run.record.answer_end_trained)

    score_all("floor", AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32))
    score_all("merged", AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32))
    for run in runs:
        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
        with expected_warnings_ignored():
            adapted = PeftModel.from_pretrained(base, run.adapter_dir)
        score_all("individual", adapted, only=run)
    results = []
    for run in runs:
        row = scores[run.name]
        result = CausalTaskEvaluation(
            task=run.task, metric=run.spec.metric, epsilon=float(run.record.epsilon if run.record.dp else math.inf),
            num_examples=len(splits[run.name]), answer_end_scored=run.record.answer_end_trained, **row)
        scoring = ("" if run.record.answer_end_trained
                   else "; the verbaliser's tokens alone: its adapter never learnt the end")
        log(f"{run.task}: floor {result.floor:.4f}, individual {result.individual:.4f}, merged {result.merged:.4f} "
            f"({run.spec.metric}, n={result.num_examples}{scoring})")
        results.append(result)
    return CausalEvaluationReport(results, merged_model=str(merged_dir), base_model=str(base_dir),
                                  max_eval_samples=max_eval_samples, split=split)
