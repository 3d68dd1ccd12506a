"""benchmarks/significance.py: exact McNemar, Holm, the seed-level paired tests, the cluster bootstrap, the count
of distinct test examples and the reports' p-value cells."""

import itertools

import numpy as np
import pytest
from scipy import stats

from benchmarks.significance import (
    adjust,
    cluster_bootstrap_ci,
    compare,
    distinct_examples,
    holm,
    holm_adjusted,
    mcnemar_p_value,
    p_cells,
    paired_p,
)


def test_mcnemar_is_the_exact_binomial_test_at_every_count():
    # b = 1, c = 5: P[X ≤ 1] for X ~ Bin(6, ½) = (1 + 6)/64, two-sided 14/64
    assert mcnemar_p_value(1, 5) == pytest.approx(14 / 64) and mcnemar_p_value(5, 1) == pytest.approx(14 / 64)
    assert mcnemar_p_value(3, 3) == 1.0 and mcnemar_p_value(0, 0) == 1.0
    for b, c in [(0, 7), (2, 9), (40, 18), (208, 167)]:  # large counts too: no χ² approximation
        assert mcnemar_p_value(b, c) == pytest.approx(stats.binomtest(b, b + c, 0.5).pvalue)
    with pytest.raises(ValueError, match="≥ 0"):
        mcnemar_p_value(-1, 3)


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


def _scores(rng, seeds, tasks, n, rate, shift):
    """Per (seed, task): the second model right at ``rate``, the first at ``rate + shift[seed]``."""
    first, second = {}, {}
    for s, t in itertools.product(range(seeds), tasks):
        second[(s, t)] = (rng.random(n) < rate).astype(np.int8)
        first[(s, t)] = (rng.random(n) < rate + shift[s]).astype(np.int8)
    return first, second


def test_seed_level_test_is_scipys_paired_t_on_seed_means_and_one_seed_falls_back_to_mcnemar():
    rng = np.random.default_rng(3)
    first, second = _scores(rng, 3, ("a", "b"), 150, 0.6, [0.05, -0.01, 0.08])
    result = compare("x", first, "y", second, resamples=200)
    ours = [np.mean([first[(s, t)].mean() for t in "ab"]) for s in range(3)]
    theirs = [np.mean([second[(s, t)].mean() for t in "ab"]) for s in range(3)]
    assert result.test == "paired t on seed means" and result.seeds == 3
    assert result.p_value == pytest.approx(stats.ttest_rel(ours, theirs).pvalue)
    assert result.seed_differences == pytest.approx(100 * (np.array(ours) - np.array(theirs)))
    assert result.difference == pytest.approx(100 * np.mean(np.array(ours) - np.array(theirs)))
    assert result.distinct_examples == 300  # 2 tasks × 150, the same examples in every seed: not 900
    one = compare("x", {k: v for k, v in first.items() if k[0] == 0}, "y",
                  {k: v for k, v in second.items() if k[0] == 0}, resamples=200)
    assert one.test == "exact McNemar" and one.seeds == 1
    assert one.p_value == pytest.approx(stats.binomtest(one.first_only, one.first_only + one.second_only).pvalue)
    with pytest.raises(ValueError, match="different strata"):
        compare("a", first, "b", {(9, "u"): first[(0, "a")]})


def test_cluster_bootstrap_is_wider_than_the_pooled_one_and_covers_when_seeds_disagree():
    """Seeds differ by N(0, 0.1²) in their true difference (mean 0.03): the pooled example bootstrap treats
    10 × 200 examples as independent and undercovers; the two-level bootstrap carries the seed variance."""
    rng = np.random.default_rng(7)
    covered = {"cluster": 0, "pooled": 0}
    widths = {"cluster": [], "pooled": []}
    repeats = 60
    for r in range(repeats):
        shift = 0.03 + 0.1 * rng.standard_normal(10)
        first, second = _scores(rng, 10, ("t",), 200, 0.45, shift)
        _, low, high = cluster_bootstrap_ci(first, second, resamples=300, seed=r)
        pooled = np.concatenate([first[k] - second[k].astype(float) for k in sorted(first)])
        ci = stats.bootstrap((pooled,), np.mean, n_resamples=300, method="percentile", random_state=r)
        for name, (lo, hi) in (("cluster", (low, high)), ("pooled", ci.confidence_interval)):
            covered[name] += lo <= 0.03 <= hi
            widths[name].append(hi - lo)
    assert np.mean(widths["cluster"]) > 1.4 * np.mean(widths["pooled"])
    assert covered["cluster"] / repeats >= 0.8 and covered["pooled"] / repeats <= 0.75


def test_holm_over_a_family_can_take_significance_away_and_distinct_examples_count_unions():
    rng = np.random.default_rng(5)
    first, second = _scores(rng, 1, ("a",), 400, 0.5, [0.07])
    alone = compare("x", first, "y", second, resamples=200)
    assert 0.001 < alone.p_value < 0.05 and alone.significant  # a family of one: Holm changes nothing
    family = adjust([alone, alone, alone])
    assert all(c.family == 3 and c.p_adjusted == pytest.approx(min(1, 3 * alone.p_value)) for c in family)
    assert not any(c.significant for c in adjust([alone] * 12))
    lengths = {(0, "a"): 3, (1, "a"): 3, (0, "b"): 2, (1, "b"): 2}
    ids = {(0, "a"): [0, 1, 2], (1, "a"): [2, 3, 4], (0, "b"): [7, 8], (1, "b"): [7, 8]}
    assert distinct_examples(list(lengths), lengths, ids) == 5 + 2
    assert distinct_examples(list(lengths), lengths, None) == 3 + 2  # a shared subset counts once


def test_paired_p_is_scipys_paired_t_and_holm_leaves_the_untested_out():
    first, second = [0.8, 0.7, 0.9], [0.6, 0.65, 0.7]
    assert paired_p(first, second) == pytest.approx(stats.ttest_rel(first, second).pvalue)
    assert paired_p(first, second, "greater") == pytest.approx(
        stats.ttest_rel(first, second, alternative="greater").pvalue)
    assert paired_p([0.9], [0.5]) is None and paired_p([0.9, 0.8], [0.5, 0.4]) is None  # one seed; one difference
    adjusted = holm_adjusted([0.01, None, 0.04])
    assert adjusted[1] is None and adjusted[::2] == pytest.approx(holm([0.01, 0.04]))
    assert p_cells(None, None) == ["—", "—"] and p_cells(0.01, 0.02) == ["0.01", "0.02 *"]
