"""The tests' one privacy-record factory: a valid record whose every field can be overridden."""

from __future__ import annotations

from typing import Any

from hf_dpmerge.records.record import PrivacyRecord


def privacy_record(task: str, epsilon: float = 3.0, **overrides: Any) -> PrivacyRecord:
    """A valid DP record for ``task`` (δ = 1e-5, N = 1600 unless overridden)."""
    fields: dict[str, Any] = dict(
        epsilon=epsilon,
        delta=1e-5,
        accountant="rdp",
        noise_multiplier=0.9,
        effective_noise_multiplier=0.9,
        sample_rate=0.02,
        steps=100,
        max_grad_norm=1.0,
        expected_batch_size=32,
        num_samples=1600,
        sam_mode="none",
        sam_rho=0.0,
        align_lambda=0.0,
        optimizer={"name": "sgd", "lr": 0.1},
        sum_lr_squared=0.01,
        base_model="org/base",
        base_model_hash=None,
        versions={"hf_dpmerge": "0.1.0"},
        task=task,
        seeded=False,
    )
    fields.update(overrides)
    return PrivacyRecord(**fields)
