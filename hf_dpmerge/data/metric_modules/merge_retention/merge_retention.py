"""Merge retention and interference as an ``evaluate`` module, for anyone's predictions.

    metric = evaluate.load("<hf_dpmerge>/data/metric_modules/merge_retention")      # accuracy by default
    metric.compute(individual_predictions=[...], merged_predictions=[...], references=[...])
    # {"individual": s_i, "merged": s_m, "retention": s_m / s_i, "interference": s_i - s_m}
    metric.from_scores(s_i, s_m)                   # the same from two scores (any metric, regression too)

For one task: s_i is the score of the task's own model, s_m that of the merged model with the task's head;
retention = s_m / s_i (NaN when s_i ≤ 0: the ratio means nothing there) and interference = s_i − s_m, in
points of the score (positive: the merge is worse on this task; it includes the merge method's own
shrinkage). The configuration names the score: ``accuracy`` (default), ``macro_f1``, ``f1`` (binary,
class 1) or ``matthews_correlation``. :meth:`MergeRetention.from_scores` is the one implementation of retention
and interference: ``hf-dpmerge evaluate`` calls it too (``hf_dpmerge.data.metrics.retention_and_interference``).
Self-contained (numpy, scikit-learn, evaluate only).
"""

import math

import datasets
import evaluate
import numpy as np
from sklearn import metrics as skm

SCORES = {
    "accuracy": lambda p, r: float(np.mean(np.asarray(p) == np.asarray(r))),
    "macro_f1": lambda p, r: float(skm.f1_score(r, p, average="macro", zero_division=0)),
    "f1": lambda p, r: float(skm.f1_score(r, p, average="binary", zero_division=0)),
    "matthews_correlation": lambda p, r: float(skm.matthews_corrcoef(r, p)),
}


class MergeRetention(evaluate.Metric):
    """Retention s_m / s_i and interference s_i − s_m of a merged model on one task."""

    def _info(self) -> evaluate.MetricInfo:
        if self.config_name == "default":
            self.config_name = "accuracy"
        if self.config_name not in SCORES:
            raise KeyError(f"merge_retention configuration must be one of {sorted(SCORES)}, got {self.config_name!r}")
        labels = datasets.Value("int64")
        return evaluate.MetricInfo(
            description=__doc__,
            citation="",
            inputs_description="individual_predictions, merged_predictions: class ids; references: true class ids",
            features=datasets.Features(
                {"individual_predictions": labels, "merged_predictions": labels, "references": labels}
            ),
        )

    def _compute(self, individual_predictions, merged_predictions, references) -> dict[str, float]:
        score = SCORES[self.config_name]
        return self.from_scores(score(individual_predictions, references), score(merged_predictions, references))

    @staticmethod
    def from_scores(individual: float, merged: float) -> dict[str, float]:
        """retention = s_m / s_i (NaN when s_i ≤ 0) and interference = s_i − s_m of the two scores."""
        return {
            "individual": individual,
            "merged": merged,
            "retention": merged / individual if individual > 0 else math.nan,
            "interference": individual - merged,
        }
