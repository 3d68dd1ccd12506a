"""FedProx's proximal term in DPSAMTrainer: μ·(θ − θ₀) added to the privatised gradient (data-free, after the noise)."""

import pytest
import torch
from transformers import TrainerCallback

from tests.utils.training_helpers import lora_classifier, make_trainer


class _Trajectory(TrainerCallback):
    """The trainable parameters after every optimizer step."""

    def __init__(self, parameters):
        self.parameters, self.steps = parameters, []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append([p.detach().clone() for p in self.parameters])


def _run(tmp_path, mu: float):
    trainer = make_trainer(tmp_path / f"mu{mu}", model=lora_classifier(seed=0), max_steps=2, optim="sgd",
                           learning_rate=0.1, lr_scheduler_type="constant", target_epsilon=None, noise_multiplier=1.0,
                           sam_mode="none", align_lambda=0.0, proximal_mu=mu)
    start = [p.detach().clone() for p in trainer._params]
    trajectory = _Trajectory(trainer._params)
    trainer.add_callback(trajectory)
    trainer.train()
    return trainer, start, trajectory.steps


def test_proximal_term_adds_mu_times_the_distance_from_the_start_to_the_noisy_gradient(tmp_path):
    """Same batches and noise (dp_seed), plain SGD at a constant η: the first step is the same with and without the
    term (θ = θ₀), and the second differs by exactly −η·μ·(θ₁ − θ₀)."""
    mu, lr = 0.5, 0.1
    plain, start, (first, second) = _run(tmp_path, 0.0)
    prox, start_prox, (first_prox, second_prox) = _run(tmp_path, mu)
    for a, b in zip(start, start_prox):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(first, first_prox):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
    moved = False
    for theta0, theta1, plain2, prox2 in zip(start, first, second, second_prox):
        torch.testing.assert_close(prox2, plain2 - lr * mu * (theta1 - theta0), rtol=0, atol=1e-6)
        moved |= bool((theta1 - theta0).abs().max() > 1e-4)
    assert moved
    assert prox.privacy_record().extra["proximal_mu"] == mu and "proximal_mu" not in plain.privacy_record().extra


@pytest.mark.parametrize("mu", [-0.1, float("nan")])
def test_a_negative_or_nan_proximal_mu_is_refused(tmp_path, mu):
    with pytest.raises(ValueError, match="proximal_mu must be a finite number ≥ 0"):
        make_trainer(tmp_path, proximal_mu=mu)
