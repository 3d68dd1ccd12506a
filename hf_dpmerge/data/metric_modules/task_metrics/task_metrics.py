"""Text-classification task metrics as an ``evaluate`` module, loadable offline by path.

    metric = evaluate.load("<hf_dpmerge>/data/metric_modules/task_metrics", "multiclass")
    metric.compute(predictions=[0, 2, 1], references=[0, 1, 1])

Configurations: ``binary`` (accuracy, F1 of class 1, Matthews correlation), ``multiclass`` (accuracy,
macro F1, Matthews correlation), ``regression`` (Pearson, Spearman). Correlations of a constant input are
reported as 0.0 (undefined; the convention scikit-learn uses for Matthews). Self-contained: ``evaluate``
copies this file into its module cache, so it imports numpy, scipy, scikit-learn and evaluate only.
"""

import datasets
import evaluate
import numpy as np
from scipy import stats
from sklearn import metrics as skm

CONFIGS = ("binary", "multiclass", "regression")


def _correlation(fn, predictions, references) -> float:
    x, y = np.asarray(predictions, dtype=float), np.asarray(references, dtype=float)
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0
    return float(fn(x, y)[0])


class TaskMetrics(evaluate.Metric):
    """Every metric that applies to a binary, multi-class or regression task (hf_dpmerge's task registry)."""

    def _info(self) -> evaluate.MetricInfo:
        if self.config_name not in CONFIGS:
            raise KeyError(f"task_metrics configuration must be one of {CONFIGS}, got {self.config_name!r}")
        kind = "float32" if self.config_name == "regression" else "int64"
        return evaluate.MetricInfo(
            description=__doc__,
            citation="",
            inputs_description="predictions: class ids (or values for regression); references: the same",
            features=datasets.Features({"predictions": datasets.Value(kind), "references": datasets.Value(kind)}),
        )

    def _compute(self, predictions, references) -> dict[str, float]:
        if self.config_name == "regression":
            return {"pearson": _correlation(stats.pearsonr, predictions, references),
                    "spearmanr": _correlation(stats.spearmanr, predictions, references)}
        result = {
            "accuracy": float(np.mean(np.asarray(predictions) == np.asarray(references))),
            "matthews_correlation": float(skm.matthews_corrcoef(references, predictions)),
        }
        if self.config_name == "binary":
            result["f1"] = float(skm.f1_score(references, predictions, average="binary", zero_division=0))
        else:
            result["macro_f1"] = float(skm.f1_score(references, predictions, average="macro", zero_division=0))
        return result
