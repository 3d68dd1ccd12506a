"""Task metrics through ``evaluate``, from the metric modules shipped in this package (offline).

``evaluate.load("accuracy")`` needs the Hub; ``evaluate.load(path)`` of a local module does not. The modules
live in ``hf_dpmerge/data/metric_modules/`` (:data:`METRIC_MODULES`): ``task_metrics`` (configurations
``binary``, ``multiclass``, ``regression``; keys ``accuracy``, ``f1`` (binary, class 1), ``macro_f1``,
``matthews_correlation``, ``pearson``, ``spearmanr``) and ``merge_retention`` (retention and interference
of a merged model from anyone's predictions). Users load them the same way::

    evaluate.load(str(hf_dpmerge.data.metrics.metric_path("merge_retention")))
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from hf_dpmerge.data.tasks import TaskSpec

ArrayLike = Sequence | np.ndarray
METRIC_MODULES = Path(__file__).with_name("metric_modules")


def metric_path(name: str) -> Path:
    """The directory of the shipped ``evaluate`` module ``name`` (``task_metrics``, ``merge_retention``)."""
    path = METRIC_MODULES / name
    if not (path / f"{name}.py").is_file():
        shipped = sorted(p.name for p in METRIC_MODULES.iterdir() if p.is_dir())
        raise KeyError(f"no metric module {name!r}; shipped: {shipped}")
    return path


@functools.cache
def load_metric(name: str, config_name: str | None = None):
    """``evaluate.load`` of a shipped module, by path (works offline); loaded once per process."""
    import evaluate

    return evaluate.load(str(metric_path(name)), config_name)


def task_metric_config(spec: TaskSpec) -> str:
    """The ``task_metrics`` configuration of ``spec``: ``regression``, ``binary`` or ``multiclass``."""
    return "regression" if spec.is_regression else ("binary" if spec.num_labels == 2 else "multiclass")


def predictions_from_logits(spec: TaskSpec, logits: np.ndarray) -> np.ndarray:
    """Class ids (argmax) for classification, the single output for regression."""
    logits = np.asarray(logits)
    return logits.reshape(len(logits), -1)[:, 0] if spec.is_regression else logits.argmax(axis=-1)


def compute_metrics(spec: TaskSpec, predictions: ArrayLike, references: ArrayLike) -> dict[str, float]:
    """All metrics that apply to ``spec`` (its primary ``spec.metric`` among them), via ``task_metrics``."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    metric = load_metric("task_metrics", task_metric_config(spec))
    return metric.compute(predictions=np.asarray(predictions).tolist(), references=np.asarray(references).tolist())


def retention_and_interference(individual: float, merged: float) -> dict[str, float]:
    """``individual``, ``merged``, ``retention`` = merged / individual (NaN when individual ≤ 0) and
    ``interference`` = individual − merged, by the shipped ``merge_retention`` module's own kernel."""
    return load_metric("merge_retention").from_scores(float(individual), float(merged))


def gain_retained(merged: float, individual: float, floor: float) -> float | None:
    """(merged − floor) / (individual − floor): the share of what the adapter adds over the ``floor`` (the base
    encoder with the task's own head) that the merge keeps; 1 keeps all of it, 0 none (docs/design.md §11).
    None when the adapter does not beat its floor (individual ≤ floor): there is no gain to retain."""
    if individual <= floor:
        return None
    return (merged - floor) / (individual - floor)


def trainer_compute_metrics(spec: TaskSpec) -> Callable:
    """A ``compute_metrics`` callable for ``transformers.Trainer`` (takes an ``EvalPrediction``)."""

    def compute(eval_prediction) -> dict[str, float]:
        logits = eval_prediction.predictions
        logits = logits[0] if isinstance(logits, tuple) else logits
        return compute_metrics(spec, predictions_from_logits(spec, logits), eval_prediction.label_ids)

    return compute
