"""The linearised noise response of Adam(W) (noise/linearised_response.py, docs/design.md §6)."""

from __future__ import annotations

import pytest
import torch

from hf_dpmerge.noise.linearised_response import AdamNoiseResponse, supports_noise_response
from hf_dpmerge.noise.optimizer_response import adam_variance
from tests.utils.training_helpers import make_trainer

STEPS, NOISE_STD, PULL = 12, 0.3, 0.4


def _train(optimizer_class: type, noise: torch.Tensor, signal: torch.Tensor, follow: bool = False,
           **hyper: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """p_T of ``optimizer_class`` on gradients signal_t + PULL·p + noise_t (float64, a decaying learning rate), and
    the followed response variance when ``follow``."""
    param = torch.nn.Parameter(torch.zeros(noise.shape[1], dtype=torch.float64))
    optimizer = optimizer_class([param], lr=0.05, **hyper)
    response = AdamNoiseResponse(optimizer, NOISE_STD, lambda: {param: PULL}) if follow else None
    for step in range(STEPS):
        param.grad = signal[step] + PULL * param.detach() + noise[step]
        optimizer.step()
        optimizer.param_groups[0]["lr"] *= 0.9
    return param.detach().clone(), None if response is None else response.variances()[param].double()


@pytest.mark.parametrize(("optimizer_class", "hyper"), [
    (torch.optim.AdamW, {"weight_decay": 0.1}),
    (torch.optim.Adam, {"weight_decay": 0.1, "betas": (0.8, 0.99)}),
    (torch.optim.Adam, {"weight_decay": 0.1, "decoupled_weight_decay": True}),
])
def test_response_equals_the_variance_of_the_linearised_run_by_finite_differences(optimizer_class, hyper) -> None:
    """σ_g²·Σ_s (∂p_T/∂n_s)², the derivatives by central differences of the real optimizer's run (coordinates are
    independent, so one perturbation per step serves them all), matches the followed covariance."""
    generator = torch.Generator().manual_seed(0)
    coordinates = 5
    signal = torch.randn(STEPS, coordinates, generator=generator, dtype=torch.float64)
    noise = NOISE_STD * torch.randn(STEPS, coordinates, generator=generator, dtype=torch.float64)
    _, followed = _train(optimizer_class, noise, signal, follow=True, **hyper)
    step_size, squares = 1e-6, torch.zeros(coordinates, dtype=torch.float64)
    for step in range(STEPS):
        bump = torch.zeros_like(noise)
        bump[step] = step_size
        up, _ = _train(optimizer_class, noise + bump, signal, **hyper)
        down, _ = _train(optimizer_class, noise - bump, signal, **hyper)
        squares += ((up - down) / (2 * step_size)).square()
    torch.testing.assert_close(followed, NOISE_STD**2 * squares, rtol=2e-3, atol=0)


def test_response_follows_a_changing_signal_that_a_constant_signal_model_misses() -> None:
    """A signal that changes sign from step to step (a head bias's batch label mix) at r ≈ 10: the variance of
    p_T over 4096 noise draws is what the response predicts (within 10 %), and > 5× the constant-signal S(r̂)."""
    generator = torch.Generator().manual_seed(1)
    draws = 4096
    signal = (10 * NOISE_STD * torch.randn(STEPS, 1, generator=generator, dtype=torch.float64)).expand(STEPS, draws)
    noise = NOISE_STD * torch.randn(STEPS, draws, generator=generator, dtype=torch.float64)
    param = torch.nn.Parameter(torch.zeros(draws, dtype=torch.float64))
    optimizer = torch.optim.AdamW([param], lr=0.05, weight_decay=0.0)
    response = AdamNoiseResponse(optimizer, NOISE_STD, dict)
    lrs = []
    for step in range(STEPS):
        param.grad = signal[step] + noise[step]
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
    measured = float(param.detach().var())
    predicted = float(response.variances()[param].double().mean())
    assert predicted / measured == pytest.approx(1.0, abs=0.1)
    second_moment = optimizer.state[param]["exp_avg_sq"] / (1 - 0.999**STEPS)
    constant = float(adam_variance(second_moment, lrs, NOISE_STD, (0.9, 0.999), 1e-8).double().mean())
    assert measured > 5 * constant


def test_only_adam_without_amsgrad_is_followed() -> None:
    param = torch.nn.Parameter(torch.zeros(2))
    assert supports_noise_response(torch.optim.AdamW([param]))
    assert not supports_noise_response(torch.optim.SGD([param], lr=0.1))
    assert not supports_noise_response(torch.optim.Adam([param], amsgrad=True))
    with pytest.raises(ValueError, match="amsgrad"):
        AdamNoiseResponse(torch.optim.Adam([param], amsgrad=True), 1.0, dict)


def test_a_dp_run_ships_the_response_of_every_trained_tensor(tmp_path) -> None:
    """A private AdamW run writes a response variance for every tensor with a second moment, positive and finite;
    a run resumed from a checkpoint followed only part of the steps and ships none."""
    from hf_dpmerge.records.noise_record import NoiseStats

    trainer = make_trainer(tmp_path, max_steps=3)
    trainer.train()
    trainer.save_model(str(tmp_path / "release"))
    stats = NoiseStats.load(tmp_path / "release")
    assert stats.response_variances.keys() == stats.second_moments.keys() != set()
    for name, value in stats.response_variances.items():
        assert value.shape == stats.second_moments[name].shape
        assert bool(torch.isfinite(value).all()) and bool((value > 0).all()), name
    trainer.noise_response.steps -= 1  # as after a resume: fewer steps followed than the run took
    trainer.save_model(str(tmp_path / "partial"))
    assert NoiseStats.load(tmp_path / "partial").response_variances == {}
