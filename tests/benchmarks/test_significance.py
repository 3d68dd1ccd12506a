"""benchmarks/significance.py: Holm, the paired t-test over seeds, the t interval of a mean over seeds and the
reports' p-value cells."""

import numpy as np
import pytest
from scipy import stats

from benchmarks.significance import holm, holm_adjusted, p_cells, paired_p, t_interval


def _holm_rejects(p_values, alpha):
    """Holm's procedure as defined: step down the sorted p, reject while p₍ⱼ₎ ≤ α/(m − j + 1)."""
    order, rejected = sorted(range(len(p_values)), key=lambda i: p_values[i]), set()
    for j, index in enumerate(order):
        if p_values[index] > alpha / (len(p_values) - j):
            break
        rejected.add(index)
    return rejected


def test_holm_adjusted_p_is_the_smallest_level_at_which_the_procedure_rejects():
    rng = np.random.default_rng(0)
    for size in (1, 2, 3, 5, 8):
        for _ in range(20):
            p = list(rng.choice([0.001, 0.01, 0.02, 0.03, 0.2, 0.5], size=size) * rng.uniform(0.5, 1.5, size))
            adjusted = holm(p)
            levels = sorted({min(1.0, k * v) for v in p for k in range(1, size + 1)} | {1.0})
            for i in range(size):
                smallest = next((a for a in levels if i in _holm_rejects(p, a * (1 + 1e-12))), 1.0)  # 1: never
                assert adjusted[i] == pytest.approx(smallest)
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])


def test_paired_p_is_scipys_paired_t_and_holm_leaves_the_untested_out():
    first, second = [0.8, 0.7, 0.9], [0.6, 0.65, 0.7]
    assert paired_p(first, second) == pytest.approx(stats.ttest_rel(first, second).pvalue)
    assert paired_p(first, second, "greater") == pytest.approx(
        stats.ttest_rel(first, second, alternative="greater").pvalue)
    assert paired_p([0.9], [0.5]) is None and paired_p([0.9, 0.8], [0.5, 0.4]) is None  # one seed; one difference
    adjusted = holm_adjusted([0.01, None, 0.04])
    assert adjusted[1] is None and adjusted[::2] == pytest.approx(holm([0.01, 0.04]))
    assert p_cells(None, None) == ["—", "—"] and p_cells(0.01, 0.02) == ["0.01", "0.02 *"]


def test_the_t_interval_is_the_mean_plus_minus_the_t_quantile_times_the_standard_error():
    values = [0.5, 0.7, 0.6, 0.8]
    half = stats.t.ppf(0.975, 3) * np.std(values, ddof=1) / np.sqrt(4)
    assert t_interval(values) == pytest.approx((0.65 - half, 0.65 + half))
    assert t_interval([0.5]) is None
