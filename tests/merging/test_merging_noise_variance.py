"""Noise left in a DP task vector: the formulas against simulated opacus DP-SGD runs."""

from __future__ import annotations

import pytest
import torch
from opacus.optimizers import DPOptimizer

from hf_dpmerge.merging.noise_variance import lora_noise_variance, parameter_noise_variance
from tests.utils.merging_builders import make_record

SIGMA, CLIP, BATCH, STEPS, COORDS = 1.2, 0.5, 16, 400, 4000


def _simulated_variance(optimizer: type[torch.optim.Optimizer], **settings: float) -> float:
    """Per-coordinate variance after STEPS opacus steps whose clipped gradients are zero (noise only)."""
    torch.manual_seed(0)
    parameter = torch.nn.Parameter(torch.zeros(COORDS))
    dp = DPOptimizer(optimizer([parameter], **settings), noise_multiplier=SIGMA, max_grad_norm=CLIP,
                     expected_batch_size=BATCH)
    for _ in range(STEPS):
        parameter.grad_sample = torch.zeros(BATCH, COORDS)
        dp.step()
        dp.zero_grad()
    return float(parameter.detach().var())


@pytest.mark.parametrize(
    ("optimizer", "settings", "record_optimizer"),
    [
        (torch.optim.SGD, {"lr": 0.01}, {"name": "SGD", "lr": 0.01}),
        (torch.optim.SGD, {"lr": 0.01, "momentum": 0.9}, {"name": "SGD", "lr": 0.01, "momentum": 0.9}),
        (torch.optim.Adam, {"lr": 1e-3}, {"name": "Adam", "lr": 1e-3}),
        (torch.optim.AdamW, {"lr": 1e-3, "weight_decay": 0.01}, {"name": "AdamW", "lr": 1e-3, "weight_decay": 0.01}),
    ],
)
def test_formula_matches_simulated_dp_sgd(optimizer, settings, record_optimizer) -> None:
    record = make_record(noise_multiplier=SIGMA, max_grad_norm=CLIP, expected_batch_size=BATCH, steps=STEPS,
                         optimizer=record_optimizer, sum_lr_squared=STEPS * settings["lr"] ** 2)
    assert _simulated_variance(optimizer, **settings) == pytest.approx(parameter_noise_variance(record), rel=0.1)


def test_non_private_and_unknown_optimizers() -> None:
    assert parameter_noise_variance(make_record(dp=False, epsilon=float("inf"))) == 0.0
    with pytest.raises(ValueError, match="noise_std"):
        parameter_noise_variance(make_record(optimizer={"name": "Adafactor"}))


def test_lora_formula_matches_monte_carlo() -> None:
    generator = torch.Generator().manual_seed(0)
    rank, rows, cols, scaling, factor_var = 4, 12, 9, 2.0, 0.01
    lora_a = torch.randn(rank, cols, generator=generator)
    lora_b = torch.randn(rows, rank, generator=generator)
    draws = 20_000
    noisy_a = lora_a + factor_var**0.5 * torch.randn(draws, rank, cols, generator=generator)
    noisy_b = lora_b + factor_var**0.5 * torch.randn(draws, rows, rank, generator=generator)
    empirical = (scaling * noisy_b @ noisy_a).var(dim=0)
    predicted = lora_noise_variance(lora_a, lora_b, scaling, factor_var)
    assert predicted.shape == (rows, cols)
    torch.testing.assert_close(predicted, empirical, rtol=0.1, atol=0)
