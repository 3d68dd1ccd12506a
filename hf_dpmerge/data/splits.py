"""Deterministic seeded splits: stratified by label, optionally grouped, and stratified subsampling.

All functions take label codes (or None for an unstratified split, e.g. regression) and return sorted
row indices, so the same seed gives the same rows on every machine.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _allocate(counts: np.ndarray, total: int) -> np.ndarray:
    """Split ``total`` across strata in proportion to ``counts`` (largest-remainder rounding)."""
    quotas = counts * total / max(int(counts.sum()), 1)
    alloc = np.floor(quotas).astype(int)
    order = np.argsort(-(quotas - alloc), kind="stable")
    alloc[order[: total - int(alloc.sum())]] += 1
    return alloc


def _strata(labels: Sequence | np.ndarray | None, n: int) -> tuple[np.ndarray, np.ndarray]:
    codes = np.zeros(n, dtype=int) if labels is None else np.unique(np.asarray(labels), return_inverse=True)[1]
    return codes, np.bincount(codes)


def stratified_split(labels: Sequence | np.ndarray | None, fraction: float, seed: int, *,
                     n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(kept, held_out)`` with about ``fraction`` of every label held out.

    Every label keeps at least one example on the kept side, so labels seen once stay trainable.
    ``labels=None`` (pass ``n``) gives a plain seeded random split.
    """
    if not 0 < fraction < 1:
        raise ValueError(f"split fraction must be in (0, 1), got {fraction}")
    size = len(labels) if labels is not None else int(n or 0)
    codes, counts = _strata(labels, size)
    held_per = np.minimum(_allocate(counts, round(fraction * size)), np.maximum(counts - 1, 0))
    rng = np.random.default_rng(seed)
    held = [rng.permutation(np.flatnonzero(codes == c))[:k] for c, k in enumerate(held_per)]
    held_idx = np.sort(np.concatenate(held)) if held else np.array([], dtype=int)
    kept_idx = np.setdiff1d(np.arange(size), held_idx)
    return kept_idx, held_idx


def grouped_stratified_split(labels: Sequence | np.ndarray, groups: Sequence, fraction: float,
                             seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(kept, held_out)`` with no group on both sides, label proportions kept close.

    Uses one fold of scikit-learn's ``StratifiedGroupKFold`` with ``k = round(1 / fraction)`` folds, so the
    held-out share is ``1/k`` of the groups' rows (0.2 → 5 folds, 0.1 → 10 folds).
    """
    from sklearn.model_selection import StratifiedGroupKFold

    if not 0 < fraction < 1:
        raise ValueError(f"split fraction must be in (0, 1), got {fraction}")
    folds = max(2, round(1 / fraction))
    splitter = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=seed)
    kept, held = next(splitter.split(np.zeros(len(labels)), np.asarray(labels), np.asarray(groups)))
    return np.sort(kept), np.sort(held)


def stratified_subsample(labels: Sequence | np.ndarray | None, size: int, seed: int, *,
                         n: int | None = None) -> np.ndarray:
    """Sorted indices of exactly ``min(size, len)`` rows, label proportions kept (largest remainder)."""
    total = len(labels) if labels is not None else int(n or 0)
    if size >= total:
        return np.arange(total)
    codes, counts = _strata(labels, total)
    rng = np.random.default_rng(seed)
    picked = [rng.permutation(np.flatnonzero(codes == c))[:k] for c, k in enumerate(_allocate(counts, size))]
    return np.sort(np.concatenate(picked))
