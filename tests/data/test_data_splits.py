import numpy as np
import pytest

from hf_dpmerge.data.splits import grouped_stratified_split, stratified_split, stratified_subsample

LABELS = np.array([0] * 50 + [1] * 30 + [2] * 19 + [3])  # class 3 is a singleton


def test_stratified_split_partitions_and_keeps_proportions():
    kept, held = stratified_split(LABELS, 0.2, seed=0)
    assert np.array_equal(np.sort(np.concatenate([kept, held])), np.arange(len(LABELS)))
    assert len(np.intersect1d(kept, held)) == 0
    assert np.bincount(LABELS[held], minlength=4).tolist() == [10, 6, 4, 0]  # 20 %, singleton stays kept


def test_stratified_split_is_seeded():
    a, b, c = (stratified_split(LABELS, 0.3, seed=s) for s in (7, 7, 8))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[1], c[1])


def test_unstratified_split_needs_only_a_size():
    kept, held = stratified_split(None, 0.25, seed=0, n=40)
    assert len(held) == 10 and len(kept) == 30


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1])
def test_bad_fraction_is_refused(fraction):
    with pytest.raises(ValueError):
        stratified_split(LABELS, fraction, seed=0)


def test_grouped_split_never_puts_a_group_on_both_sides():
    rng = np.random.default_rng(0)
    groups = rng.integers(0, 60, size=600)
    labels = (rng.random(600) < 0.6).astype(int)
    kept, held = grouped_stratified_split(labels, groups, 0.2, seed=3)
    assert not set(groups[kept]) & set(groups[held])
    assert len(kept) + len(held) == 600
    assert 0.1 < len(held) / 600 < 0.3
    again = grouped_stratified_split(labels, groups, 0.2, seed=3)
    assert np.array_equal(held, again[1])


def test_subsample_has_exact_size_and_proportions():
    picked = stratified_subsample(LABELS, 10, seed=0)
    assert len(picked) == 10 and len(set(picked)) == 10
    assert np.bincount(LABELS[picked], minlength=4).tolist() == [5, 3, 2, 0]
    assert np.array_equal(stratified_subsample(LABELS, 1000, seed=0), np.arange(len(LABELS)))


def test_one_raw_row_moves_many_others_between_the_seeded_splits():
    """Why a card's ε is about the training set as split (records/statement.py's split_scope), not the raw data:
    removing one raw row re-draws the permutation, and other rows change sides."""
    labels = np.arange(400) % 2
    kept, _ = stratified_split(labels, 0.1, seed=42)
    kept_without, _ = stratified_split(labels[1:], 0.1, seed=42)  # raw row 0 removed; row i is now i - 1
    moved = np.setxor1d(kept[kept > 0], kept_without + 1)
    assert len(moved) > 10
