"""The domain-weighting benchmark's slope: ordinary least squares of the target's accuracy on its weight."""

import numpy as np
import pytest

from benchmarks.domain_weighting import target_slope


def _rows(weights, accuracies):
    return [{"weight": w, "tasks": {"t": {"merged": a}, "other": {"merged": 0.5}}} for w, a in zip(weights, accuracies)]


def test_slope_and_its_standard_error_match_numpys_least_squares_fit():
    weights, accuracies = [0, 1, 2, 4, 8], [0.900, 0.902, 0.912, 0.920, 0.930]
    slope, error = target_slope(_rows(weights, accuracies), "t")
    x, y = np.array(weights, dtype=float), 100 * np.array(accuracies)
    (fit_slope, fit_intercept), covariance = np.polyfit(x, y, 1, cov=True)  # numpy scales by residual/(k − 2)
    assert slope == pytest.approx(fit_slope)
    assert error == pytest.approx(np.sqrt(covariance[0, 0]))


def test_a_flat_curve_has_slope_zero_and_two_weights_are_refused():
    slope, error = target_slope(_rows([0, 1, 2], [0.8, 0.8, 0.8]), "t")
    assert slope == 0 and error == 0
    with pytest.raises(ValueError, match="at least three different --weights"):
        target_slope(_rows([0, 1], [0.8, 0.9]), "t")
