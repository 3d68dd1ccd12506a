"""Private selection among candidate merges: the mechanisms' distributions, sensitivity and composition."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from hf_dpmerge.records.private_selection import accuracy_sensitivity, select_private, selection_probabilities
from hf_dpmerge.records.selection_record import SelectionRecord, composed_guarantee

UTILITIES = [0.61, 0.74, 0.70, 0.52, 0.73]
DRAWS = 4000


def _frequencies(mechanism: str, epsilon: float, sensitivity: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    picks = [select_private(UTILITIES, epsilon, sensitivity, mechanism, rng) for _ in range(DRAWS)]
    return np.bincount(picks, minlength=len(UTILITIES)) / DRAWS


@pytest.mark.parametrize("mechanism", ["exponential", "permute_and_flip"])
def test_large_epsilon_selects_the_non_private_argmax(mechanism: str) -> None:
    # ε·(u_best − u_second)/(2Δ) = 1e4·0.01/(2·1e-3) = 5e4: any other pick has probability < e^-40000
    frequencies = _frequencies(mechanism, epsilon=1e4, sensitivity=1e-3)
    assert frequencies[int(np.argmax(UTILITIES))] == 1.0


@pytest.mark.parametrize("mechanism", ["exponential", "permute_and_flip"])
def test_tiny_epsilon_is_near_uniform(mechanism: str) -> None:
    frequencies = _frequencies(mechanism, epsilon=1e-6, sensitivity=1e-3)
    counts = frequencies * DRAWS
    expected = DRAWS / len(UTILITIES)
    chi_square = float(((counts - expected) ** 2 / expected).sum())
    assert chi_square < 18.47  # χ²(4 d.o.f.) 0.999 quantile
    assert 0.5 * np.abs(frequencies - 1 / len(UTILITIES)).sum() < 0.04  # total variation


def test_exponential_mechanism_matches_its_softmax_distribution() -> None:
    epsilon, sensitivity = 2.0, 0.02  # ε/(2Δ) = 50: the top two candidates share most of the mass
    expected = selection_probabilities(UTILITIES, epsilon, sensitivity)
    frequencies = _frequencies("exponential", epsilon, sensitivity, seed=1)
    assert 0.5 * np.abs(frequencies - expected).sum() < 0.03
    assert expected[1] / expected[4] == pytest.approx(math.exp(50 * 0.01))


def _exact_permute_and_flip(utilities: list[float], epsilon: float, sensitivity: float) -> np.ndarray:
    """P&F's output distribution by enumerating every visiting order."""
    flip = np.exp(epsilon * (np.asarray(utilities) - max(utilities)) / (2 * sensitivity))
    probabilities = np.zeros(len(utilities))
    orders = list(itertools.permutations(range(len(utilities))))
    for order in orders:
        survive = 1.0
        for k in order:
            probabilities[k] += survive * flip[k] / len(orders)
            survive *= 1 - flip[k]
    return probabilities


def test_permute_and_flip_samples_its_exact_distribution_which_is_epsilon_dp() -> None:
    epsilon, sensitivity = 2.0, 0.02
    expected = _exact_permute_and_flip(UTILITIES, epsilon, sensitivity)
    assert expected.sum() == pytest.approx(1.0)
    frequencies = _frequencies("permute_and_flip", epsilon, sensitivity, seed=2)
    assert 0.5 * np.abs(frequencies - expected).sum() < 0.03
    here = _exact_permute_and_flip([0.5, 0.6, 0.55, 0.3], 1.0, 0.1)
    neighbour = _exact_permute_and_flip([0.6, 0.5, 0.55, 0.4], 1.0, 0.1)  # every utility moved by at most Δ
    assert np.all(np.maximum(here / neighbour, neighbour / here) <= math.exp(1.0) + 1e-12)


def test_accuracy_sensitivity_is_one_example_of_the_smallest_task_over_the_task_count() -> None:
    assert accuracy_sensitivity([1000, 250, 500]) == pytest.approx(1 / (3 * 250))
    counts, sizes = np.array([600, 200, 400]), np.array([1000, 250, 500])
    utility = np.mean(counts / sizes)
    for task in range(3):  # one example added, removed or replaced in any task moves one count by ≤ 1
        for change in (-1, 1):
            moved = counts.copy()
            moved[task] += change
            assert abs(np.mean(moved / sizes) - utility) <= accuracy_sensitivity(list(sizes)) + 1e-15
    with pytest.raises(ValueError, match="at least one validation example"):
        accuracy_sensitivity([10, 0])


def test_bad_arguments_are_refused() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="--epsilon"):
        select_private([0.1, 0.2], 0.0, 0.01, "exponential", rng)
    with pytest.raises(ValueError, match="--mechanism"):
        select_private([0.1, 0.2], 1.0, 0.01, "laplace", rng)


def test_composed_epsilon_follows_the_sum_and_max_rules(make_record) -> None:
    records = {"a": make_record("a", epsilon=8.0), "b": make_record("b", epsilon=4.0)}
    records["b"].delta = 1e-6
    # by hand: sequential = max(8, 4) + 0.5; parallel = max(8, 4, 0.5); δ = max(1e-5, 1e-6)
    assert composed_guarantee(records, 0.5, "sequential") == (8.5, 1e-5)
    assert composed_guarantee(records, 0.5, "parallel") == (8.0, 1e-5)
    assert composed_guarantee(records, 9.0, "parallel") == (9.0, 1e-5)
    records["c"] = make_record("c", epsilon=math.inf, dp=False)
    assert composed_guarantee(records, 0.5, "sequential")[0] == math.inf
    with pytest.raises(ValueError, match="--composition"):
        composed_guarantee(records, 0.5, "advanced")


def test_selection_record_round_trips(tmp_path) -> None:
    record = SelectionRecord(
        mechanism="exponential", epsilon=0.5, sensitivity=1e-3, utility="accuracy", relation="replacement",
        unit="validation example", composition="sequential", candidates=[{"lambda": 0.3}, {"lambda": 1.0}],
        chosen=1, validation_sizes={"a": 500}, adapters={"a": {"epsilon": 8.0, "delta": 1e-5}},
        total_epsilon=8.5, total_delta=1e-5,
    )
    record.save(tmp_path)
    loaded = SelectionRecord.load(tmp_path / "dp_selection.json")
    assert loaded == record
    (tmp_path / "dp_selection.json").write_text("{}")
    with pytest.raises(ValueError, match="unreadable selection record"):
        SelectionRecord.load(tmp_path / "dp_selection.json")
