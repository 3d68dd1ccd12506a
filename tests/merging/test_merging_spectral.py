"""The spectral merges' maths (TSV-M, Iso-C, Iso-CTS, WUDI) on cases worked by hand or by an independent numpy
transcription of the papers' steps, and the noise floor against simulated noise matrices."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_dpmerge.merging.methods.iso import common_space_sizes, iso_c_merge, iso_cts_merge
from hf_dpmerge.merging.methods.spectral import joint_rank, spectrum, task_spectra
from hf_dpmerge.merging.methods.tsv import tsv_merge
from hf_dpmerge.merging.methods.wudi import wudi_merge
from hf_dpmerge.noise.floor import lora_noise_edge, noise_edge

KERNELS = {"tsv": tsv_merge, "iso_c": iso_c_merge, "iso_cts": iso_cts_merge,
           "wudi": lambda t, edges=None: wudi_merge(t, solver="least_squares", edges=edges)}


def _random(seed: int, count: int, rows: int, cols: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, cols, generator=generator, dtype=torch.float64) for _ in range(count)]


def _orthonormal(seed: int, rows: int, cols: int) -> torch.Tensor:
    return torch.linalg.qr(_random(seed, 1, rows, cols)[0])[0]


def _polar(matrix: np.ndarray) -> np.ndarray:
    left, _, right_t = np.linalg.svd(matrix, full_matrices=False)
    return left @ right_t


def _lora(seed: int, count: int, d_out: int = 12, rank: int = 4, d_in: int = 10) -> list[tuple[torch.Tensor, ...]]:
    """LoRA deltas (s·B_i, A) sharing one A."""
    a, *bs = _random(seed, 1, rank, d_in) + _random(seed + 100, count, d_out, rank)
    return [(0.5 * b, a) for b in bs]


def test_tsv_of_orthogonal_rank_one_task_vectors_is_their_sum() -> None:
    left, right = _orthonormal(0, 8, 3), _orthonormal(1, 6, 3)
    taus = [s * torch.outer(left[:, i], right[:, i]) for i, s in enumerate([3.0, 2.0, 0.5])]
    torch.testing.assert_close(tsv_merge(taus), sum(taus))


def _tsv_numpy(taus: list[torch.Tensor], k: int) -> np.ndarray:
    parts = [np.linalg.svd(t.numpy(), full_matrices=False) for t in taus]
    u = np.concatenate([p[0][:, :k] for p in parts], axis=1)
    v = np.concatenate([p[2][:k].T for p in parts], axis=1)
    return _polar(u) @ np.diag(np.concatenate([p[1][:k] for p in parts])) @ _polar(v).T


def test_tsv_follows_the_papers_steps() -> None:
    """Full-rank 6×5 task vectors, T = 3: k = ⌊5/3⌋ = 1 component each, stacked, polar factors (numpy); a given
    ``k`` replaces ⌊R/T⌋."""
    taus = _random(2, 3, 6, 5)
    np.testing.assert_allclose(tsv_merge(taus).numpy(), _tsv_numpy(taus, 1), atol=1e-12)
    np.testing.assert_allclose(tsv_merge(taus, k=2).numpy(), _tsv_numpy(taus, 2), atol=1e-12)


def test_iso_c_output_is_the_sums_singular_vectors_with_a_flat_spectrum() -> None:
    taus = _random(3, 3, 7, 5)
    left, values, right_t = torch.linalg.svd(sum(taus), full_matrices=False)
    merged = iso_c_merge(taus)
    torch.testing.assert_close(torch.linalg.svdvals(merged), values.mean().expand(5))
    torch.testing.assert_close(merged, values.mean() * left @ right_t)


def test_iso_c_of_a_rank_deficient_sum_flattens_its_nonzero_spectrum_only() -> None:
    """A LoRA sum of rank 4 in 12×10: σ̄ is the mean of its 4 singular values, the output has rank 4."""
    factors = _lora(4, 3)
    total = sum(left @ right for left, right in factors)
    values = torch.linalg.svdvals(total)[:4]
    merged = iso_c_merge(factors)
    torch.testing.assert_close(torch.linalg.svdvals(merged)[:5], torch.cat([values.mean().expand(4), values[:1] * 0]))


def test_common_space_sizes_round_as_the_paper() -> None:
    assert common_space_sizes(768, 8, 0.8) == (616, 19)  # int(614.4) = 614, round(154/8) = 19, 768 − 8·19
    assert common_space_sizes(4, 4, 0.8) == (4, 0)  # round(1/4) = 0: the common subspace is everything
    assert common_space_sizes(6, 3, 0.8) == (3, 1)


def test_iso_cts_follows_the_papers_steps() -> None:
    """Full-rank 6×6 task vectors, T = 3, f = 0.8: common 3, one direction of each residual (numpy)."""
    taus = [t.numpy() for t in _random(5, 3, 6, 6)]
    u, s, v_t = np.linalg.svd(sum(taus))
    lefts, values, rights = [u[:, :3]], [s[:3]], [v_t[:3].T]
    for tau in taus:
        ru, rs, rv_t = np.linalg.svd(tau - u[:, :3] @ u[:, :3].T @ tau)
        lefts.append(ru[:, :1])
        values.append(rs[:1])
        rights.append(rv_t[:1].T)
    stacked = np.concatenate(values)
    expected = stacked.mean() * _polar(np.concatenate(lefts, axis=1)) @ _polar(np.concatenate(rights, axis=1)).T
    np.testing.assert_allclose(iso_cts_merge([torch.from_numpy(t) for t in taus]).numpy(), expected, atol=1e-12)
    full = iso_cts_merge([torch.from_numpy(t) for t in taus], common_space_fraction=1.0)
    torch.testing.assert_close(full, iso_c_merge([torch.from_numpy(t) for t in taus]))  # all common: Iso-C


def test_wudi_least_squares_is_the_normal_equations_minimiser_and_adam_reaches_it() -> None:
    """A well-conditioned case (4×3, full-rank M): τ* solves τ·M = C, and Adam from Σ τ_i gets there."""
    taus = _random(6, 3, 4, 3)
    weights = [1 / float(t.square().sum()) for t in taus]
    gram = sum(w * t.T @ t for w, t in zip(weights, taus))
    target = sum(w * t @ t.T @ t for w, t in zip(weights, taus))
    expected = torch.linalg.solve(gram.T, target.T).T
    torch.testing.assert_close(wudi_merge(taus, solver="least_squares"), expected)
    torch.testing.assert_close(wudi_merge(taus, steps=1000, lr=3e-2), expected, atol=1e-5, rtol=0)  # float32 Adam

    def loss(tau: torch.Tensor) -> float:
        return float(sum(w * ((tau - t) @ t.T).square().sum() for w, t in zip(weights, taus)))

    assert loss(expected) < loss(sum(taus))


def test_wudi_with_the_papers_settings_moves_each_coordinate_by_about_steps_times_lr() -> None:
    """Adam, 300 steps of lr 1e-5 from Σ τ_i: a step moves a coordinate by ≈ lr while its gradient keeps its sign, so
    the merge stays within ≈ 300·lr = 3e-3 of task arithmetic (an early-stopped descent, as the paper's)."""
    taus = _random(7, 3, 5, 4)
    moved = (wudi_merge(taus) - sum(taus)).abs()
    assert 0.9 * 300 * 1e-5 < float(moved.max()) < 1.01 * 300 * 1e-5


@pytest.mark.parametrize("method", sorted(KERNELS))
def test_lora_factors_give_the_dense_merge_and_stay_in_the_shared_as_row_space(method: str) -> None:
    factors = _lora(8, 3)
    dense = [left @ right for left, right in factors]
    merged = KERNELS[method](factors)
    torch.testing.assert_close(merged, KERNELS[method](dense), atol=1e-10, rtol=0)
    a = factors[0][1]
    torch.testing.assert_close(merged @ torch.linalg.pinv(a) @ a, merged)  # rows in A's row space
    assert joint_rank(task_spectra(factors)) == 4  # R = r: TSV keeps ⌊4/3⌋ = 1 direction per task


def test_wudi_adam_leaves_the_row_space() -> None:
    """Adam's per-coordinate steps do not keep the rows of Σ τ_i in A's row space (--as-adapter refuses it)."""
    factors = _lora(9, 3)
    merged = wudi_merge(factors, steps=50, lr=1e-3)
    a = factors[0][1]
    assert float((merged @ torch.linalg.pinv(a) @ a - merged).abs().max()) > 1e-4


def test_spectrum_of_factors_is_the_dense_thin_svd() -> None:
    left, right = _random(10, 1, 9, 3)[0], _random(11, 1, 3, 8)[0]
    thin, dense = spectrum((left, right)), spectrum(left @ right)
    assert thin.rank == dense.rank == 3
    torch.testing.assert_close(thin.values, dense.values)
    torch.testing.assert_close(thin.dense(), left @ right)


@pytest.mark.parametrize(("rows", "cols"), [(200, 50), (300, 300), (500, 20), (64, 1000)])
def test_the_noise_edge_is_the_top_singular_value_of_iid_gaussian_matrices(rows: int, cols: int) -> None:
    """s(√m + √n): the mean top singular value of 8 draws lies within 3 % of it, none 2 % above."""
    generator = torch.Generator().manual_seed(rows + cols)
    std = 0.3
    tops = torch.stack([torch.linalg.matrix_norm(std * torch.randn(rows, cols, generator=generator,
                                                                   dtype=torch.float64), ord=2) for _ in range(8)])
    edge = noise_edge(std**2, (rows, cols))
    assert edge == pytest.approx(std * (rows**0.5 + cols**0.5))
    assert float(tops.mean()) == pytest.approx(edge, rel=0.03) and float(tops.max()) < 1.02 * edge


def _lora_noise_tops(a: torch.Tensor, variance_b: torch.Tensor, scaling: float, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.stack([torch.linalg.matrix_norm(
        scaling * (variance_b.sqrt() * torch.randn(variance_b.shape, generator=generator, dtype=torch.float64)) @ a,
        ord=2) for _ in range(8)])


def test_the_lora_noise_edge_with_a_flat_a_is_the_mp_edge_scaled_by_a() -> None:
    """ΔW noise s·N·A with A = c·(orthonormal rows), N 384×8 i.i.d. N(0, v): s·√v·c·(√384 + √8)."""
    c, scaling, std = 0.7, 2.0, 0.01
    a = c * _orthonormal(12, 256, 8).T
    variance = torch.full((384, 8), std**2, dtype=torch.float64)
    edge = lora_noise_edge(a, torch.zeros(384, 8), scaling, 0.0, std**2)
    assert edge == pytest.approx(scaling * std * c * (384**0.5 + 8**0.5))
    tops = _lora_noise_tops(a, variance, scaling, 13)
    assert 0.95 * edge < float(tops.mean()) < edge


@pytest.mark.parametrize("heterogeneous", [False, True])
def test_the_lora_noise_edge_bounds_the_noise_of_a_random_a_tightly(heterogeneous: bool) -> None:
    """A Gaussian A (384 × 8) and per-coordinate V_B (rows and columns scaled up to 6×): the simulated top singular
    value stays under the edge and within 15 % of it."""
    generator = torch.Generator().manual_seed(14)
    a = torch.randn(8, 384, generator=generator, dtype=torch.float64) / 384**0.5
    variance = torch.full((768, 8), 1e-4, dtype=torch.float64)
    if heterogeneous:
        variance = variance * (0.2 + torch.rand(768, 1, generator=generator, dtype=torch.float64)) \
            * (0.2 + torch.rand(1, 8, generator=generator, dtype=torch.float64))
    edge = lora_noise_edge(a, torch.zeros(768, 8), 2.0, 0.0, variance)
    tops = _lora_noise_tops(a, variance, 2.0, 15)
    assert 0.85 * edge < float(tops.mean()) and float(tops.max()) < edge


def test_the_lora_noise_edge_with_noise_in_both_factors_bounds_the_simulation() -> None:
    generator = torch.Generator().manual_seed(16)
    a = torch.randn(8, 256, generator=generator, dtype=torch.float64) / 16
    b = 0.05 * torch.randn(384, 8, generator=generator, dtype=torch.float64)
    edge = lora_noise_edge(a, b, 2.0, 1e-4, 1e-4)
    assert edge > lora_noise_edge(a, b, 2.0, 0.0, 1e-4)
    tops = [torch.linalg.matrix_norm(2.0 * ((b + nb) @ (a + na) - b @ a), ord=2) for nb, na in (
        (0.01 * torch.randn(384, 8, generator=generator, dtype=torch.float64),
         0.01 * torch.randn(8, 256, generator=generator, dtype=torch.float64)) for _ in range(8))]
    assert float(max(tops)) < edge


@pytest.mark.parametrize("method", sorted(KERNELS))
def test_the_noise_floor_drops_the_directions_only_noise_explains(method: str) -> None:
    """Rank-2 signals (singular values 3, 2) plus i.i.d. noise of edge ≈ 0.59 (40 × 30, s = 0.05): truncated at the
    edge each task keeps its 2 signal directions, and the merge equals the merge of the truncated task vectors."""
    generator = torch.Generator().manual_seed(17)
    noisy, edges = [], []
    for task in range(3):
        left, right = _orthonormal(20 + task, 40, 2), _orthonormal(30 + task, 30, 2)
        noise = 0.05 * torch.randn(40, 30, generator=generator, dtype=torch.float64)
        noisy.append(left @ torch.diag(torch.tensor([3.0, 2.0], dtype=torch.float64)) @ right.T + noise)
        edges.append(noise_edge(0.05**2, (40, 30)))
    truncated = [s.dense() for s in task_spectra(noisy, edges)]
    assert [torch.linalg.matrix_rank(t, atol=1e-9) for t in truncated] == [2, 2, 2]
    merged = KERNELS[method](noisy, edges=edges)
    torch.testing.assert_close(merged, KERNELS[method](truncated), atol=1e-9, rtol=0)
    assert not torch.allclose(merged, KERNELS[method](noisy), atol=1e-3)
