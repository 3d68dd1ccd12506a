"""Cauchy PoE merge: the fixed point minimises the paper's energy, and the fast paths change nothing."""

from __future__ import annotations

import pytest
import torch

from hf_dpmerge.merging.methods import cauchy_poe
from hf_dpmerge.merging.methods.cauchy_poe import (
    _full_rank,
    averaged_by_rule,
    cauchy_energy,
    cauchy_poe_delta,
    cauchy_poe_merge,
    combine,
    dual_iterates,
    fixed_point_iterates,
    thin_basis,
)

JITTER = 1e-3


def _problem(seed: int, count: int = 4, rows: int = 6, cols: int = 5, spread: float = 0.7) -> torch.Tensor:
    """Task vectors sharing a common direction, as fine-tunes of one base do."""
    generator = torch.Generator().manual_seed(seed)
    shared = torch.randn(rows, cols, generator=generator, dtype=torch.float64)
    return torch.stack([shared + spread * torch.randn(rows, cols, generator=generator, dtype=torch.float64)
                        for _ in range(count)])


def _gamma2(taus: torch.Tensor, tol: float) -> torch.Tensor:
    return tol * taus.square().sum(dim=(1, 2))


def _brute_force(taus: torch.Tensor, gamma2: torch.Tensor, seed: int) -> float:
    """min E by L-BFGS from the inputs, their sum and mean, zero, and random points."""
    generator = torch.Generator().manual_seed(seed)
    starts = [*taus, taus.sum(0), taus.mean(0), torch.zeros_like(taus[0])]
    starts += [torch.randn(taus.shape[1:], generator=generator, dtype=torch.float64) for _ in range(3)]
    best = float("inf")
    for start in starts:
        zeta = start.clone().requires_grad_(True)
        optimizer = torch.optim.LBFGS([zeta], max_iter=2000, tolerance_grad=1e-12, tolerance_change=1e-15,
                                      line_search_fn="strong_wolfe")

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            residual = torch.stack([(tau.T @ (zeta - tau)).square().sum() for tau in taus])
            energy = torch.log(gamma2 + residual).sum() + JITTER * zeta.square().sum()
            energy.backward()
            return energy

        optimizer.step(closure)
        best = min(best, cauchy_energy(zeta.detach(), taus, gamma2, JITTER))
    return best


@pytest.mark.parametrize(("seed", "tol"), [(0, 0.5), (1, 1.0), (2, 2.0), (3, 2.0)])
def test_fixed_point_reaches_brute_force_minimum(seed: int, tol: float) -> None:
    taus = _problem(seed)
    gamma2 = _gamma2(taus, tol)
    zeta = cauchy_poe_delta(taus, gamma2, JITTER, max_iter=5000, conv_tol=1e-12)
    ours = cauchy_energy(zeta, taus, gamma2, JITTER)
    assert ours <= _brute_force(taus, gamma2, seed) + 1e-6 * abs(ours)


def test_independent_random_experts_reach_brute_force_minimum_at_released_tol() -> None:
    generator = torch.Generator().manual_seed(5)
    taus = torch.randn(3, 6, 5, generator=generator, dtype=torch.float64)
    gamma2 = _gamma2(taus, 2.0)
    ours = cauchy_energy(cauchy_poe_delta(taus, gamma2, JITTER, 5000, 1e-12), taus, gamma2, JITTER)
    assert ours <= _brute_force(taus, gamma2, 5) + 1e-6 * abs(ours)


@pytest.mark.parametrize("tol", [0.01, 0.5, 2.0])
def test_energy_never_increases(tol: float) -> None:
    taus = _problem(7, count=5, rows=8, cols=6, spread=1.5)
    gamma2 = _gamma2(taus, tol)
    energies = [cauchy_energy(z, taus, gamma2, JITTER) for z in fixed_point_iterates(taus, gamma2, JITTER, 200, 0.0)]
    assert len(energies) > 100  # Anderson extrapolations that would raise E are rejected, not yielded
    assert all(later <= earlier + 1e-10 * abs(earlier) for earlier, later in zip(energies, energies[1:]))
    assert energies[-1] < energies[0]


def test_orthogonal_task_subspaces_give_task_arithmetic() -> None:
    generator = torch.Generator().manual_seed(0)
    basis = torch.linalg.qr(torch.randn(12, 12, generator=generator, dtype=torch.float64)).Q
    taus = torch.stack([basis[:, 4 * i : 4 * i + 4] @ torch.randn(4, 7, generator=generator, dtype=torch.float64)
                        for i in range(3)])
    # the ridge j‖ζ‖² is the only thing between the MAP and Σ τ_i: it vanishes as j -> 0
    zeta = cauchy_poe_delta(taus, _gamma2(taus, 0.5), 1e-12, 100, 1e-14)
    torch.testing.assert_close(zeta, taus.sum(0), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(("rows", "cols", "count", "rank"), [(200, 30, 4, 2), (300, 120, 6, 4), (40, 400, 3, 1)])
def test_low_rank_path_equals_dense_path(rows: int, cols: int, count: int, rank: int) -> None:
    generator = torch.Generator().manual_seed(rows)
    taus = torch.stack([torch.randn(rows, rank, generator=generator) @ torch.randn(rank, cols, generator=generator)
                        for _ in range(count)]).double()
    assert thin_basis(taus) is not None  # the thin path is the one taken
    gamma2 = _gamma2(taus, 0.1)
    thin = cauchy_poe_delta(taus, gamma2, JITTER, 500, 1e-8, low_rank=True)
    dense = cauchy_poe_delta(taus, gamma2, JITTER, 500, 1e-8, low_rank=False)
    assert float((thin - dense).abs().max()) <= 1e-5 * float(dense.abs().max())


def test_dual_path_gives_the_same_iterates_for_tall_full_rank_matrices() -> None:
    taus = torch.randn(4, 400, 30, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    gamma2 = _gamma2(taus, 0.05)
    primal = list(fixed_point_iterates(taus, gamma2, JITTER, 30, 1e-9))
    dual = [combine(taus, y.reshape(4, 30, 30)) for y in dual_iterates(taus, gamma2, JITTER, 30, 1e-9)]
    assert len(primal) == len(dual) > 2
    for dense, lifted in zip(primal, dual):
        assert float(torch.dist(lifted, dense) / torch.linalg.norm(dense)) < 1e-8
    assert thin_basis(taus, max_width=64) is None  # so cauchy_poe_delta takes the dual path
    merged = cauchy_poe_delta(taus, gamma2, JITTER, 30, 1e-9)
    assert float(torch.dist(merged, primal[-1]) / torch.linalg.norm(primal[-1])) < 1e-8


def test_thin_basis_refuses_full_rank_task_vectors() -> None:
    taus = torch.randn(4, 300, 300, generator=torch.Generator().manual_seed(0))
    assert thin_basis(taus) is None


@pytest.mark.parametrize("spread", [10.0, 0.3, 0.05, 1e-3, 1e-4])  # independent, agreeing, nearly equal experts
def test_full_rank_float32_merge_stays_within_tolerance_of_the_float64_fixed_point(spread: float) -> None:
    """Full-rank float32 blocks take the float32 dense path, polished in float64: within 1e-4·max|ζ| of the
    float64 fixed point even for near-identical experts (float32 alone: 2.4e-4 at spread 1e-3)."""
    taus = 1e-3 * _problem(11, count=4, rows=96, cols=96, spread=spread).float()
    assert thin_basis(taus) is None  # neither the thin nor the dual path applies
    gamma2 = _gamma2(taus.double(), 0.01)
    merged = cauchy_poe_delta(taus, gamma2, JITTER, 500, 1e-6)
    exact = cauchy_poe_delta(taus.double(), gamma2, JITTER, 5000, 1e-12)
    assert merged.dtype == torch.float32
    assert float((merged.double() - exact).abs().max()) <= 1e-4 * float(exact.abs().max())


def test_float32_run_that_does_not_converge_is_redone_in_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    taus = 1e-3 * _problem(12, count=4, rows=64, cols=64, spread=0.3).float()
    gamma2 = _gamma2(taus.double(), 0.01)
    monkeypatch.setattr(cauchy_poe, "_FLOAT32_MAX_ITER", 1)  # float32 stops after one solve, unconverged
    redone = cauchy_poe_delta(taus, gamma2, JITTER, 500, 1e-6)
    exact = cauchy_poe_delta(taus.double(), gamma2, JITTER, 500, 1e-6)
    torch.testing.assert_close(redone, exact.float())


@pytest.mark.parametrize(("rank", "width"), [(5, 8), (8, 8), (40, 8), (20, 30)])
def test_gram_rank_check_agrees_with_qr(rank: int, width: int) -> None:
    generator = torch.Generator().manual_seed(rank)
    sketch = torch.randn(50, rank, generator=generator) @ torch.randn(rank, width, generator=generator)
    diagonal = torch.linalg.qr(sketch).R.diagonal().abs()
    assert _full_rank(sketch, 1e-4) == bool((diagonal > 1e-4 * diagonal.max()).all()) == (rank >= width)


def test_lora_sized_merge_in_float32_matches_float64_dense() -> None:
    generator = torch.Generator().manual_seed(1)
    base = torch.randn(256, 256, generator=generator) * 0.05
    deltas = [1e-3 * torch.randn(256, 8, generator=generator) @ torch.randn(8, 256, generator=generator)
              for _ in range(4)]
    merged = cauchy_poe_merge(base, [base + d for d in deltas], lam=0.7, tol=1e-2, jitter=JITTER, max_iter=500,
                              conv_tol=1e-6)
    taus = torch.stack([(base + d).double() - base.double() for d in deltas])
    exact = cauchy_poe_delta(taus, _gamma2(taus, 1e-2), JITTER, 5000, 1e-12, low_rank=False)
    assert merged.dtype == torch.float32
    torch.testing.assert_close(merged.double(), base.double() + 0.7 * exact, rtol=1e-4, atol=1e-6)


def test_vectors_merge_by_their_mean_and_unchanged_inputs_are_ignored() -> None:
    base = torch.randn(5)
    inputs = [base + 1.0, base - 0.25]
    torch.testing.assert_close(cauchy_poe_merge(base, inputs, lam=0.5, tol=0.1, jitter=JITTER, max_iter=5,
                                                conv_tol=0.0), base + 0.5 * 0.375)  # λ·mean
    matrix = torch.randn(6, 4)
    changed = matrix + torch.randn(6, 4)
    alone = cauchy_poe_merge(matrix, [changed], lam=1.0, tol=0.1, jitter=JITTER, max_iter=50, conv_tol=1e-9)
    with_copy = cauchy_poe_merge(matrix, [changed, matrix.clone()], lam=1.0, tol=0.1, jitter=JITTER, max_iter=50,
                                 conv_tol=1e-9)
    torch.testing.assert_close(alone, with_copy)
    assert torch.equal(cauchy_poe_merge(matrix, [matrix.clone()], lam=1.0, tol=0.1, jitter=JITTER, max_iter=5,
                                        conv_tol=0.0), matrix)


def test_dp_calibration_down_weights_the_noisier_expert() -> None:
    taus = _problem(11, count=2, rows=8, cols=6, spread=2.0).float()
    base = torch.zeros(8, 6)
    kwargs = dict(lam=1.0, tol=0.1, jitter=JITTER, max_iter=200, conv_tol=1e-8)
    plain = cauchy_poe_merge(base, list(taus), **kwargs)
    calibrated = cauchy_poe_merge(base, list(taus), noise_variance=[0.0, 1.0], **kwargs)
    assert torch.dist(calibrated, taus[0]) < torch.dist(plain, taus[0])
    assert torch.dist(calibrated, taus[1]) > torch.dist(plain, taus[1])


def test_cholesky_failure_retries_with_more_jitter_then_names_the_tensor() -> None:
    taus = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    gamma2 = _gamma2(taus, 0.1)
    singular = torch.stack([taus[0], taus[0]])[:, :, :1].expand(2, 3, 8).contiguous()  # rank-1 Grams
    with pytest.warns(UserWarning, match="extra jitter"):
        cauchy_poe_delta(singular, _gamma2(singular, 0.1), -1e-14, 3, 0.0, low_rank=False, name="w")
    with pytest.raises(ValueError, match="encoder.layer.3.query.weight"):
        cauchy_poe_delta(taus, gamma2, -1e3, 3, 0.0, low_rank=False, name="encoder.layer.3.query.weight")


def _hard_family(seed: int) -> torch.Tensor:
    """Experts that disagree strongly at a small width: the plain MM iteration crawls here."""
    return _problem(seed, count=6, rows=10, cols=8, spread=3.0)


@pytest.mark.parametrize("seed", range(4))
def test_accelerated_iteration_reaches_the_fixed_point_where_50_plain_steps_do_not(seed: int) -> None:
    taus = _hard_family(seed)
    gamma2 = _gamma2(taus, 0.01)
    exact = _last_plain(taus, gamma2, 20_000)
    merged = cauchy_poe_delta(taus, gamma2, JITTER, 500, 1e-10, low_rank=False)
    assert float(torch.dist(merged, exact) / torch.linalg.norm(exact)) < 1e-6


def _last_plain(taus: torch.Tensor, gamma2: torch.Tensor, steps: int) -> torch.Tensor:
    *_, last = fixed_point_iterates(taus, gamma2, JITTER, steps, 1e-13, accelerate=False)
    return last


def test_stopping_early_warns_naming_the_tensor_and_the_residual_change() -> None:
    taus = _hard_family(0)
    with pytest.warns(UserWarning, match=r"layer\.0\.query\.weight: stopped at max_iter=3 .*relative change of α"):
        cauchy_poe_delta(taus, _gamma2(taus, 0.01), JITTER, 3, 1e-8, low_rank=False, name="layer.0.query.weight")


def test_reference_layer_rule() -> None:
    """1-D tensors, embeddings and wide matrices: λ·mean τ_i; tall: PoE per d_in×d_in row block; square: whole."""
    generator = torch.Generator().manual_seed(4)
    kwargs = dict(lam=0.8, tol=0.05, jitter=JITTER, max_iter=500, conv_tol=1e-10)
    for name, shape in [("encoder.LayerNorm.bias", (7,)), ("embeddings.word_embeddings.weight", (40, 6)),
                        ("output.dense.weight", (5, 12))]:
        base = torch.randn(shape, generator=generator, dtype=torch.float64)
        inputs = [base + torch.randn(shape, generator=generator, dtype=torch.float64) for _ in range(3)]
        mean = torch.stack([t - base for t in inputs]).mean(0)
        torch.testing.assert_close(cauchy_poe_merge(base, inputs, name=name, **kwargs), base + 0.8 * mean)
    assert averaged_by_rule("encoder.LayerNorm.bias", torch.Size([7]), "whole")
    assert not averaged_by_rule("output.dense.weight", torch.Size([5, 12]), "whole")
    base = torch.zeros(10, 4, dtype=torch.float64)
    taus = _problem(9, count=3, rows=10, cols=4)
    merged = cauchy_poe_merge(base, list(taus), name="intermediate.dense.weight", **kwargs)
    for rows in (slice(0, 4), slice(4, 8), slice(8, 10)):
        block = taus[:, rows]
        expected = cauchy_poe_delta(block, _gamma2(block, 0.05), JITTER, 500, 1e-10, low_rank=False)
        torch.testing.assert_close(merged[rows], 0.8 * expected)
    whole = cauchy_poe_merge(base, list(taus), name="intermediate.dense.weight", layers="whole", **kwargs)
    exact = cauchy_poe_delta(taus, _gamma2(taus, 0.05), JITTER, 500, 1e-10, low_rank=False)
    torch.testing.assert_close(whole, 0.8 * exact)


def test_lora_factors_give_the_exact_thin_path_even_from_a_bf16_cache() -> None:
    generator = torch.Generator().manual_seed(2)
    base = 0.05 * torch.randn(96, 96, generator=generator)
    factors = [(1e-2 * torch.randn(96, 4, generator=generator), torch.randn(4, 96, generator=generator))
               for _ in range(3)]
    exact_inputs = [base.double() + (left @ right).double() for left, right in factors]
    kwargs = dict(lam=1.0, tol=0.01, jitter=JITTER, max_iter=500, conv_tol=1e-10)
    reference = cauchy_poe_merge(base.double(), exact_inputs, **kwargs)
    cached = [tensor.to(torch.bfloat16).float() for tensor in exact_inputs]  # what a bf16 merge cache holds
    from_cache = cauchy_poe_merge(base, cached, **kwargs)
    from_factors = cauchy_poe_merge(base, cached, factors=factors, **kwargs)

    def error(merged: torch.Tensor) -> float:
        delta = reference - base.double()
        return float(torch.dist(merged.double() - base.double(), delta) / torch.linalg.norm(delta))

    assert error(from_factors) < 1e-4
    assert error(from_cache) > 100 * error(from_factors)
