"""Private selection among candidate merges: the mechanisms' distributions, sensitivity and composition."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from dataclasses import asdict

import numpy as np
import pytest
from scipy.signal import convolve

from hf_dpmerge.records.selection_record import SelectionRecord, composed_guarantee
from hf_dpmerge.records.statement import PrivacyStatement
from hf_dpmerge.training.dp.private_selection import (
    accuracy_sensitivity,
    select_private,
    selection_probabilities,
    subsample_indices,
    task_averaged_accuracy,
    unit_capped_indices,
)
from tests.utils.records import privacy_record

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


def test_accuracy_sensitivity_is_one_example_of_the_smallest_public_size_over_the_task_count() -> None:
    assert accuracy_sensitivity([1000, 250, 500]) == pytest.approx(1 / (3 * 250))
    counts, sizes = np.array([600, 200, 400]), {"a": 1000, "b": 250, "c": 500}
    utility = task_averaged_accuracy(dict(zip(sizes, counts, strict=True)), sizes)
    assert utility == pytest.approx((0.6 + 0.8 + 0.8) / 3)
    for task in range(3):  # one example added, removed or replaced in any task moves one count by ≤ 1
        for change in (-1, 1):
            moved = counts.copy()
            moved[task] += change
            moved_utility = task_averaged_accuracy(dict(zip(sizes, moved, strict=True)), sizes)
            assert abs(moved_utility - utility) <= accuracy_sensitivity(list(sizes.values())) + 1e-15
    with pytest.raises(ValueError, match="--validation_size"):
        accuracy_sensitivity([10, 0])


def test_subsample_is_uniform_over_the_subsets_of_size_min_n_and_the_set_size() -> None:
    rng = np.random.default_rng(3)
    assert subsample_indices(3, 5, rng).tolist() == [0, 1, 2]  # a set smaller than n is kept whole
    assert subsample_indices(0, 5, rng).tolist() == []
    draws = 6000
    counts = Counter(tuple(subsample_indices(5, 2, rng).tolist()) for _ in range(draws))
    assert set(counts) == set(itertools.combinations(range(5), 2))
    expected = draws / 10
    assert sum((c - expected) ** 2 / expected for c in counts.values()) < 27.88  # χ²(9 d.o.f.) 0.999 quantile


# --------------------------------------------------------------- exact privacy over enumerated neighbours
# Each validation example is a 0/1 vector: which of the K candidate merges classify it correctly. A task's
# validation set is a list of them; the mechanism's exact output law averages the exponential mechanism (or
# permute-and-flip) over every equally likely subsample, and is compared on every neighbouring collection.

K = 3
N_PUBLIC = 3
EXAMPLE_TYPES = list(itertools.product((0, 1), repeat=K))


def _count_law(examples: list[tuple[int, ...]], n: int) -> np.ndarray:
    """Exact law of the task's correct-count vector c ∈ {0..n}^K over the uniform min(n, |D|)-subsamples."""
    law = np.zeros((n + 1,) * K)
    subsets = list(itertools.combinations(examples, min(n, len(examples))))
    for subset in subsets:
        law[tuple(np.sum(np.array(subset, dtype=int).reshape(-1, K), axis=0))] += 1 / len(subsets)
    return law


def _kernels(tasks: int, epsilon: float) -> dict[str, np.ndarray]:
    """P(k | total counts c) of both mechanisms, u = c/(T·n) (one public n for all tasks), Δ from the public n."""
    sensitivity = accuracy_sensitivity([N_PUBLIC] * tasks)
    shape = (tasks * N_PUBLIC + 1,) * K
    kernels = {name: np.zeros((*shape, K)) for name in ("exponential", "permute_and_flip")}
    for cell in np.ndindex(*shape):
        utility = [task_averaged_accuracy({"all": c}, {"all": tasks * N_PUBLIC}) for c in cell]
        kernels["exponential"][cell] = selection_probabilities(utility, epsilon, sensitivity)
        kernels["permute_and_flip"][cell] = _exact_permute_and_flip(utility, epsilon, sensitivity)
    return kernels


def _neighbours(examples: list[tuple[int, ...]]):
    """Every set that differs from ``examples`` by the addition, removal or replacement of one example."""
    for i in range(len(examples)):
        yield examples[:i] + examples[i + 1:]
        yield from (examples[:i] + [kind] + examples[i + 1:] for kind in EXAMPLE_TYPES if kind != examples[i])
    yield from ([*examples, kind] for kind in EXAMPLE_TYPES)


def _task_sets(tasks: int, kind: str, seed: int) -> list[list[tuple[int, ...]]]:
    """Sizes cycle below, at and above the public n = 3; 'separated': candidate 0 always right, 1 always wrong."""
    rng = np.random.default_rng(seed)
    sizes = [(2, 3, 4, 5), (1, 3, 5, 2)][kind == "random"]
    sets = []
    for t in range(tasks):
        size = sizes[t % len(sizes)]
        if kind == "separated":
            sets.append([(1, 0, int(b)) for b in rng.integers(0, 2, size)])
        else:
            sets.append([EXAMPLE_TYPES[i] for i in rng.integers(0, len(EXAMPLE_TYPES), size)])
    return sets


def _log_ratio(here: np.ndarray, there: np.ndarray) -> float:
    return float(np.max(np.abs(np.log(here) - np.log(there))))


def _worst_log_ratio_public_size(task_sets, kernel: np.ndarray) -> float:
    """The selection as ``hf-dpmerge tune`` makes it (subsample to the public n, u on n, Δ from n): the largest
    |log P(k | D) − log P(k | D')| over every neighbour D' and outcome k, exactly.

    P(k | D) = Σ_c P(c_t = c)·G_t(c, k) with G_t(c, k) = Σ_r P(Σ_{s≠t} c_s = r)·P(k | c + r): the other tasks'
    laws are convolved once per changed task t."""
    laws = [_count_law(examples, N_PUBLIC) for examples in task_sets]
    prefix, suffix = [np.ones((1,) * K)], [np.ones((1,) * K)]
    for law in laws:
        prefix.append(convolve(prefix[-1], law, method="direct"))
    for law in reversed(laws):
        suffix.insert(0, convolve(law, suffix[0], method="direct"))
    here = np.tensordot(prefix[-1], kernel, axes=K)
    worst = 0.0
    for t, examples in enumerate(task_sets):
        rest = convolve(prefix[t], suffix[t + 1], method="direct")
        given = np.zeros((N_PUBLIC + 1,) * K + (K,))
        for cell in np.ndindex(*given.shape[:K]):
            window = tuple(slice(c, c + r) for c, r in zip(cell, rest.shape, strict=True))
            given[cell] = np.tensordot(rest, kernel[window], axes=K)
        for changed in _neighbours(examples):
            worst = max(worst, _log_ratio(here, np.tensordot(_count_law(changed, N_PUBLIC), given, axes=K)))
    return worst


def _old_private_size_selection(task_sets, epsilon: float) -> np.ndarray:
    """The selection before the sizes were public: every example scored, denominators and Δ from |D_t|."""
    sizes = {str(t): len(examples) for t, examples in enumerate(task_sets)}
    utility = [task_averaged_accuracy({str(t): sum(e[k] for e in examples) for t, examples in enumerate(task_sets)},
                                      sizes) for k in range(K)]
    return selection_probabilities(utility, epsilon, accuracy_sensitivity(list(sizes.values())))


def _worst_log_ratio_private_size(task_sets, epsilon: float) -> float:
    here = _old_private_size_selection(task_sets, epsilon)
    return max(_log_ratio(here, _old_private_size_selection([*task_sets[:t], changed, *task_sets[t + 1:]], epsilon))
               for t, examples in enumerate(task_sets) for changed in _neighbours(examples))


@pytest.mark.parametrize("tasks", [2, 3, 4, 8])
def test_the_selection_is_epsilon_dp_over_every_enumerated_neighbour(tasks: int) -> None:
    epsilon = 1.0
    kernels = _kernels(tasks, epsilon)
    worst = {}
    for kind, seed in (("separated", 0), ("random", 1)):
        sets = _task_sets(tasks, kind, seed)
        for mechanism, kernel in kernels.items():
            worst[kind, mechanism] = _worst_log_ratio_public_size(sets, kernel)
    assert max(worst.values()) <= epsilon + 1e-9, worst
    assert worst["separated", "exponential"] > 0.9 * epsilon, worst  # the bound is approached, not vacuous
    # the old path (Δ and denominators from the private sizes) on the same neighbours exceeds ε for T ≥ 3
    old = _worst_log_ratio_private_size(_task_sets(tasks, "separated", 0), epsilon)
    assert (old > epsilon + 1e-9) == (tasks >= 3), old
    assert old > 0.4 * epsilon * tasks, old  # it grows like ε·T/2


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


def test_selection_record_round_trips_and_states_the_public_size_and_relation(tmp_path) -> None:
    record = SelectionRecord(
        mechanism="exponential", epsilon=0.5, sensitivity=1e-3, utility="accuracy",
        relation="addition, removal or replacement", unit="validation example", composition="sequential",
        candidates=[{"lambda": 0.3}, {"lambda": 1.0}], chosen=1, validation_size={"a": 500},
        adapters={"a": {"epsilon": 8.0, "delta": 1e-5}}, total_epsilon=8.5, total_delta=1e-5,
    )
    record.save(tmp_path)
    loaded = SelectionRecord.load(tmp_path / "dp_selection.json")
    assert loaded == record
    records = {"a": privacy_record("a", epsilon=8.0)}
    statement = PrivacyStatement.from_selection(loaded, records, {}).derivation()
    assert "`lambda` = 1.0 was chosen" in statement
    assert "per addition, removal or replacement of one validation example" in statement
    assert "public validation size n = 500 per task" in statement
    record.validation_size = {"a": 500, "b": 200}
    assert "public validation size n = a: 500, b: 200" in PrivacyStatement.from_selection(record, records,
                                                                                     {}).derivation()
    (tmp_path / "dp_selection.json").write_text("{}")
    with pytest.raises(ValueError, match="unreadable selection record"):
        SelectionRecord.load(tmp_path / "dp_selection.json")
    old = {**json.loads(json.dumps(asdict(loaded))), "schema_version": 1, "validation_sizes": {"a": 178}}
    del old["validation_size"]
    (tmp_path / "dp_selection.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match="private validation sizes.*re-run hf-dpmerge tune"):
        SelectionRecord.load(tmp_path / "dp_selection.json")


# One task's validation rows as (unit, correct under candidate 0, 1, 2): the other units B, the unit U that a
# neighbour replaces, adds or removes, and its replacement U'. Candidate 0 is right exactly on U', 1 exactly on U.
_OTHER = [("a", 0, 1, 1), ("a", 0, 1, 0), ("b", 0, 1, 1)]
_NEIGHBOURS = {  # (U's rows, U′'s rows): replace with the same or another number of rows, add, remove
    "replace": ([("u", 0, 1, 0)] * 2, [("u", 1, 0, 1)] * 2),
    "replace, more rows": ([("u", 0, 1, 1)], [("w", 1, 0, 0)] * 3),
    "add": ([], [("u", 1, 0, 1)] * 3),
    "remove": ([("u", 0, 1, 0)] * 3, []),
}


@pytest.mark.parametrize("rows_per_unit, n", [(1, 2), (2, 2), (2, 5), (3, 4)])
def test_one_whole_unit_changes_every_candidates_utility_by_at_most_delta(rows_per_unit: int, n: int) -> None:
    """Replace-one-unit or add/remove-one-unit changes at most m of a task's n scored rows: with every other row's
    key shared (every key order enumerated), each candidate's utility moves by ≤ Δ = m/(T·n), and by Δ exactly for
    some order (tight). Task 2 (per example, n = 50) is unchanged; T = 2."""
    other_size = 50
    delta = accuracy_sensitivity([n, other_size], [rows_per_unit, 1])
    assert delta == rows_per_unit / (2 * n)
    worst = 0.0
    for removed, added in _NEIGHBOURS.values():
        rows = _OTHER + removed + added
        here = list(range(len(_OTHER) + len(removed)))
        there = list(range(len(_OTHER))) + list(range(len(here), len(rows)))
        for order in itertools.permutations(range(len(rows))):
            keys = np.asarray(order, dtype=float)
            utilities = []
            for side in (here, there):
                scored = [side[i] for i in unit_capped_indices([rows[i][0] for i in side], rows_per_unit, n,
                                                               keys[side])]
                assert all(Counter(rows[i][0] for i in scored)[unit] <= rows_per_unit for unit in "abuw")
                utilities.append([task_averaged_accuracy({"t": sum(rows[i][1 + k] for i in scored), "other": 20},
                                                         {"t": n, "other": other_size}) for k in range(3)])
            worst = max(worst, *np.abs(np.subtract(*utilities)))
    assert worst <= delta + 1e-12
    assert worst == pytest.approx(min(rows_per_unit, n) / (2 * n))  # tight: m rows of U′ scored where none of B's
    if rows_per_unit > 1:
        assert worst > accuracy_sensitivity([n, other_size])  # a per-row Δ would not bound one unit


def test_unit_capped_indices_keeps_at_most_m_rows_of_each_unit_then_n() -> None:
    units = ["x"] * 30 + ["y"] * 2 + list(range(5))
    rng = np.random.default_rng(0)
    for m, n, size in ((1, 100, 7), (2, 100, 9), (3, 4, 4)):
        scored = unit_capped_indices(units, m, n, rng.random(len(units)))
        assert len(scored) == size and list(scored) == sorted(set(scored))
        assert max(Counter(units[i] for i in scored).values()) <= m
    with pytest.raises(ValueError, match="--rows_per_unit"):
        accuracy_sensitivity([10, 10], [0, 1])
