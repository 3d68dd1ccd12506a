import numpy as np
import pytest
from transformers import EvalPrediction

from hf_dpmerge.data import compute_metrics, get_task_spec, predictions_from_logits, trainer_compute_metrics
from hf_dpmerge.data.metrics import gain_retained, load_metric, metric_path


def _binary(predictions, references) -> dict[str, float]:
    return load_metric("task_metrics", "binary").compute(predictions=predictions, references=references)


def _regression(predictions, references) -> dict[str, float]:
    return load_metric("task_metrics", "regression").compute(predictions=predictions, references=references)

PRED = [1, 1, 0, 1, 0, 0, 1, 0]
REF = [1, 0, 0, 1, 1, 0, 1, 0]  # tp=3, fp=1, fn=1, tn=3


def test_binary_metrics_by_hand():
    tp, fp, fn, tn = 3, 1, 1, 3
    scores = _binary(PRED, REF)
    assert scores["accuracy"] == pytest.approx(6 / 8)
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    assert scores["f1"] == pytest.approx(2 * precision * recall / (precision + recall))
    mcc = (tp * tn - fp * fn) / np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert scores["matthews_correlation"] == pytest.approx(mcc)


def test_correlations_by_hand():
    x, y = np.array([1.0, 2.0, 4.0, 3.0]), np.array([2.0, 1.0, 5.0, 4.0])
    dx, dy = x - x.mean(), y - y.mean()
    scores = _regression(x.tolist(), y.tolist())
    assert scores["pearson"] == pytest.approx((dx @ dy) / np.sqrt((dx @ dx) * (dy @ dy)))
    rank_diff = np.array([1, 2, 4, 3]) - np.array([2, 1, 4, 3])
    assert scores["spearmanr"] == pytest.approx(1 - 6 * (rank_diff @ rank_diff) / (4 * (16 - 1)))
    assert _regression([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])["pearson"] == 0.0  # constant: undefined, reported as 0


def test_compute_metrics_keys_follow_the_task():
    assert set(compute_metrics(get_task_spec("rotten_tomatoes"), PRED, REF)) == {
        "accuracy", "f1", "matthews_correlation"}
    multi = compute_metrics(get_task_spec("bbc_news"), [0, 1, 2, 2], [0, 1, 2, 3])
    assert multi["accuracy"] == 0.75 and "macro_f1" in multi
    assert set(compute_metrics(get_task_spec("stsb"), [0.1, 0.5, 0.2], [1.0, 4.0, 2.0])) == {"pearson", "spearmanr"}
    for spec in map(get_task_spec, ["cola", "stsb", "mrpc", "reuters_r52"]):
        probe = [0.0, 1.0] if spec.is_regression else [0, 1]
        assert spec.metric in compute_metrics(spec, probe, probe)
    with pytest.raises(ValueError):
        compute_metrics(get_task_spec("sst2"), [0, 1], [0])


def test_trainer_metrics_from_logits():
    logits = np.array([[0.1, 0.9], [2.0, -1.0], [0.0, 0.3]])
    assert predictions_from_logits(get_task_spec("sst2"), logits).tolist() == [1, 0, 1]
    assert predictions_from_logits(get_task_spec("stsb"), np.array([[0.5], [1.5]])).tolist() == [0.5, 1.5]
    metrics = trainer_compute_metrics(get_task_spec("sst2"))(EvalPrediction(logits, np.array([1, 0, 0])))
    assert metrics["accuracy"] == pytest.approx(2 / 3)


def test_users_load_the_merge_retention_metric_with_evaluate_by_path():
    import evaluate

    retention = evaluate.load(str(metric_path("merge_retention")))  # offline: a local module
    result = retention.compute(individual_predictions=[0, 1, 1, 0], merged_predictions=[0, 1, 0, 0],
                               references=[0, 1, 1, 1])
    assert result == {"individual": 0.75, "merged": 0.5, "retention": pytest.approx(2 / 3), "interference": 0.25}
    f1 = evaluate.load(str(metric_path("merge_retention")), "macro_f1")
    assert f1.compute(individual_predictions=[0, 1], merged_predictions=[0, 1], references=[0, 1])["retention"] == 1.0
    with pytest.raises(KeyError, match="no metric module 'bleu'"):
        metric_path("bleu")


def test_gain_retained_arithmetic():
    assert gain_retained(0.8, 0.9, 0.5) == pytest.approx(0.75)
    assert gain_retained(0.5, 0.9, 0.5) == 0.0
    assert gain_retained(0.95, 0.9, 0.5) == pytest.approx(1.125)
    assert gain_retained(0.7, 0.5, 0.5) is None  # the adapter does not beat the floor
    assert gain_retained(0.7, 0.4, 0.5) is None
