"""Task metrics computed offline with scikit-learn and scipy (``evaluate.load`` needs the Hub).

Keys: ``accuracy``, ``f1`` (binary, positive class 1), ``macro_f1`` (more than two classes),
``matthews_correlation``, ``pearson``, ``spearmanr``. Correlations of a constant input are reported as 0.0
(undefined; the convention scikit-learn uses for Matthews).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats
from sklearn import metrics as skm

from hf_dpmerge.data.tasks import TaskSpec

ArrayLike = Sequence | np.ndarray


def accuracy(predictions: ArrayLike, references: ArrayLike) -> float:
    return float(np.mean(np.asarray(predictions) == np.asarray(references)))


def f1(predictions: ArrayLike, references: ArrayLike, average: str = "binary") -> float:
    return float(skm.f1_score(references, predictions, average=average, zero_division=0))


def matthews_correlation(predictions: ArrayLike, references: ArrayLike) -> float:
    return float(skm.matthews_corrcoef(references, predictions))


def _correlation(fn: Callable, predictions: ArrayLike, references: ArrayLike) -> float:
    x, y = np.asarray(predictions, dtype=float), np.asarray(references, dtype=float)
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0
    return float(fn(x, y)[0])


def pearson(predictions: ArrayLike, references: ArrayLike) -> float:
    return _correlation(stats.pearsonr, predictions, references)


def spearmanr(predictions: ArrayLike, references: ArrayLike) -> float:
    return _correlation(stats.spearmanr, predictions, references)


def predictions_from_logits(spec: TaskSpec, logits: np.ndarray) -> np.ndarray:
    """Class ids (argmax) for classification, the single output for regression."""
    logits = np.asarray(logits)
    return logits.reshape(len(logits), -1)[:, 0] if spec.is_regression else logits.argmax(axis=-1)


def compute_metrics(spec: TaskSpec, predictions: ArrayLike, references: ArrayLike) -> dict[str, float]:
    """All metrics that apply to ``spec`` (its primary ``spec.metric`` among them)."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if spec.is_regression:
        return {"pearson": pearson(predictions, references), "spearmanr": spearmanr(predictions, references)}
    result = {
        "accuracy": accuracy(predictions, references),
        "matthews_correlation": matthews_correlation(predictions, references),
    }
    if spec.num_labels == 2:
        result["f1"] = f1(predictions, references)
    else:
        result["macro_f1"] = f1(predictions, references, average="macro")
    return result


def trainer_compute_metrics(spec: TaskSpec) -> Callable:
    """A ``compute_metrics`` callable for ``transformers.Trainer`` (takes an ``EvalPrediction``)."""

    def compute(eval_prediction) -> dict[str, float]:
        logits = eval_prediction.predictions
        logits = logits[0] if isinstance(logits, tuple) else logits
        return compute_metrics(spec, predictions_from_logits(spec, logits), eval_prediction.label_ids)

    return compute
