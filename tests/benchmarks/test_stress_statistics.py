"""The stress grid's statistics: McNemar's p-value, the paired bootstrap CI, gain retained, tuning on validation."""

from pathlib import Path

import numpy as np
import pytest

from benchmarks.quality.floor import gain_retained
from benchmarks.quality.significance import compare, mcnemar_p_value, paired_bootstrap_ci
from benchmarks.quality.tuning import tune


def test_mcnemar_exact_matches_a_hand_computation_and_scipy():
    # b = 1, c = 5: P[X ≤ 1] for X ~ Bin(6, ½) = (1 + 6)/64, two-sided 14/64
    assert mcnemar_p_value(1, 5) == pytest.approx(14 / 64)
    assert mcnemar_p_value(5, 1) == pytest.approx(14 / 64)
    assert mcnemar_p_value(3, 3) == 1.0 and mcnemar_p_value(0, 0) == 1.0
    stats = pytest.importorskip("scipy.stats")
    for b, c in [(0, 7), (2, 9), (10, 4), (12, 12)]:
        assert mcnemar_p_value(b, c) == pytest.approx(stats.binomtest(b, b + c, 0.5).pvalue)


def test_mcnemar_large_counts_use_the_continuity_corrected_chi_square():
    stats = pytest.importorskip("scipy.stats")
    b, c = 40, 18
    assert mcnemar_p_value(b, c) == pytest.approx(stats.chi2.sf((abs(b - c) - 1) ** 2 / (b + c), 1))
    with pytest.raises(ValueError, match="≥ 0"):
        mcnemar_p_value(-1, 3)


def test_paired_bootstrap_ci_covers_a_known_difference_and_excludes_zero():
    rng = np.random.default_rng(1)
    strata_a, strata_b = {}, {}
    for task in ("a", "b", "c"):
        second = (rng.random(2000) < 0.7).astype(int)
        first = second.copy()
        flip = rng.choice(np.flatnonzero(second == 0), size=200, replace=False)  # first fixes 200 more: +10 points
        first[flip] = 1
        strata_a[task], strata_b[task] = first, second
    difference, low, high = paired_bootstrap_ci(strata_a, strata_b, resamples=1000)
    assert difference == pytest.approx(0.1)
    assert low < 0.1 < high and low > 0
    result = compare("first", strata_a, "second", strata_b, resamples=500)
    assert result.first_only == 600 and result.second_only == 0 and result.significant
    assert result.difference == pytest.approx(10.0)


def test_paired_bootstrap_ci_of_identical_models_is_not_significant():
    rng = np.random.default_rng(2)
    scores = {"t": (rng.random(300) < 0.6).astype(int)}
    noisy = {"t": np.where(rng.random(300) < 0.1, 1 - scores["t"], scores["t"])}  # random flips both ways
    result = compare("a", scores, "b", noisy, resamples=500)
    assert result.ci_low < 0 < result.ci_high or not result.significant
    with pytest.raises(ValueError, match="different strata"):
        compare("a", scores, "b", {"u": scores["t"]})


def test_gain_retained_arithmetic():
    assert gain_retained(0.8, 0.9, 0.5) == pytest.approx(0.75)
    assert gain_retained(0.5, 0.9, 0.5) == 0.0
    assert gain_retained(0.95, 0.9, 0.5) == pytest.approx(1.125)
    assert gain_retained(0.7, 0.5, 0.5) is None  # the adapter does not beat the floor
    assert gain_retained(0.7, 0.4, 0.5) is None


def test_tuning_selects_on_validation_and_reads_test_once_for_the_choice():
    # validation prefers point 1, test would prefer point 2: a selection that read test would pick 2
    validation = {0: 0.5, 1: 0.8, 2: 0.6}
    test = {0: 0.1, 1: 0.2, 2: 0.9}
    calls, discarded = [], []

    def merge(index, point):
        return Path(f"merged-{index}")

    def score(directory, split):
        index = int(directory.name.split("-")[1])
        calls.append((split, index))
        value = (validation if split == "validation" else test)[index]
        return {"task": np.array([1] * int(100 * value) + [0] * (100 - int(100 * value)))}

    result = tune([{"lambda": 0.5}, {"lambda": 1.0}, {"lambda": 2.0}], merge, score, discarded.append)
    assert result["selected"] == 1 and result["point"] == {"lambda": 1.0}
    assert calls == [("validation", 0), ("validation", 1), ("validation", 2), ("test", 1)]
    assert float(result["test"]["task"].mean()) == pytest.approx(0.2)
    assert [t["mean"] for t in result["trials"]] == pytest.approx([0.5, 0.8, 0.6])
    assert sorted(discarded) == [Path("merged-0"), Path("merged-1"), Path("merged-2")]


def test_tuning_keeps_the_first_point_on_ties():
    result = tune([{"x": 1}, {"x": 2}], lambda i, p: Path(str(i)), lambda d, s: {"t": np.array([1, 0])},
                  lambda d: None)
    assert result["selected"] == 0
