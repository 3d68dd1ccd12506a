"""Client-level (user-level) DP at the server: DP-FedAvg's Gaussian mechanism (McMahan et al., ICLR 2018,
arXiv:1710.06963, Algorithm 1 with the fixed-denominator estimator).

Each round every client is sampled with probability q (Poisson), each sampled client's whole update u_k is
clipped to L2 norm S, and

    ū = (Σ_{k sampled} clip_S(u_k) + N(0, z²S²·I)) / (q·K)

is released: R rounds are R steps of opacus' accountant at (z, q) under add/remove-one client (sensitivity S);
replace-one client (2S) is stated beside it. δ defaults to 1/(100·K); δ ≥ 1/K is refused unless
``allow_large_delta``. Why Flower's DP wrappers are not used: docs/design.md §12.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from hf_dpmerge.training.dp.accounting import PrivacyAccountant

Update = Mapping[str, torch.Tensor]


def update_norm(update: Update) -> float:
    """‖u‖₂ of an update over all of its tensors together."""
    return math.sqrt(sum(float(t.double().square().sum()) for t in update.values()))


def clip_update(update: Update, clip_norm: float) -> dict[str, torch.Tensor]:
    """u · min(1, S/‖u‖₂), the whole update scaled as one vector."""
    norm = update_norm(update)
    scale = min(1.0, clip_norm / norm) if norm > 0 else 1.0
    return {name: tensor * scale for name, tensor in update.items()}


def sample_clients(clients: Sequence[int], sample_rate: float, generator: torch.Generator) -> list[int]:
    """Poisson sampling: each client independently with probability ``sample_rate`` (may be none)."""
    if not 0 < sample_rate <= 1:
        raise ValueError(f"client sample rate must lie in (0, 1], got {sample_rate}")
    draws = torch.rand(len(clients), generator=generator, dtype=torch.float64)
    return [client for client, draw in zip(clients, draws.tolist()) if draw < sample_rate]


def private_mean_update(
    updates: Sequence[Update],
    template: Update,
    *,
    clip_norm: float,
    noise_multiplier: float,
    expected_clients: float,
    generator: torch.Generator,
) -> dict[str, torch.Tensor]:
    """(Σ_k clip_S(u_k) + N(0, z²S²I)) / expected_clients; ``template`` gives names and shapes when no
    client was sampled (a noise-only round)."""
    if not (math.isfinite(clip_norm) and clip_norm > 0):
        raise ValueError(f"client clip norm S must be > 0, got {clip_norm}")
    if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
        raise ValueError(f"client noise multiplier z must be ≥ 0, got {noise_multiplier}")
    if not expected_clients > 0:
        raise ValueError(f"expected number of sampled clients must be > 0, got {expected_clients}")
    total = {name: torch.zeros_like(tensor, dtype=torch.float32) for name, tensor in template.items()}
    for update in updates:
        if set(update) != set(total):
            raise ValueError(f"a client update has tensors {sorted(set(update) ^ set(total))} that others lack")
        for name, tensor in clip_update(update, clip_norm).items():
            total[name] += tensor.float()
    std = noise_multiplier * clip_norm
    for name in sorted(total):  # a fixed order, so a seeded generator reproduces the noise
        noise = torch.randn(total[name].shape, generator=generator, dtype=torch.float32)
        # the public q·K, not the realised count, which would make the sensitivity data-dependent
        total[name] = (total[name] + std * noise) / expected_clients
    return total


def default_client_delta(num_clients: int) -> float:
    """δ = 1/(100·K): K·δ, the union bound on the guarantee failing for some client, is 1% for every K."""
    return 1 / (100 * num_clients)


@dataclass(frozen=True)
class ClientLevelDP:
    """The server's mechanism: clip norm S, noise multiplier z, client sample rate q over K clients, δ
    (default :func:`default_client_delta`; ≥ 1/K only with ``allow_large_delta``), accounted with opacus'
    ``accountant`` ('prv' or 'rdp')."""

    noise_multiplier: float
    clip_norm: float
    sample_rate: float
    num_clients: int
    accountant: str = "prv"
    target_delta: float | None = None
    allow_large_delta: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.sample_rate <= 1:
            raise ValueError(f"--client_sample_rate must lie in (0, 1], got {self.sample_rate}")
        if not (math.isfinite(self.clip_norm) and self.clip_norm > 0):
            raise ValueError(f"--client_clip_norm must be > 0, got {self.clip_norm}")
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise ValueError(f"--client_noise_multiplier must be > 0, got {self.noise_multiplier}")
        if not 0 < self.delta < 1:
            raise ValueError(f"--client_delta must lie in (0, 1), got {self.delta:g}")
        # a mechanism releasing one random client's data in the clear satisfies δ = 1/K
        if self.delta >= 1 / self.num_clients and not self.allow_large_delta:
            raise ValueError(
                f"client-level δ={self.delta:g} ≥ 1/K = {1 / self.num_clients:g}: such a δ allows releasing a "
                "whole client's data; lower --client_delta or pass --allow_large_client_delta"
            )

    @property
    def delta(self) -> float:
        return self.target_delta if self.target_delta is not None else default_client_delta(self.num_clients)

    @property
    def expected_clients(self) -> float:
        return self.sample_rate * self.num_clients

    def accountant_for_rounds(self) -> PrivacyAccountant:
        """A fresh accountant of this mechanism: one subsampled Gaussian step at (z, q) per round."""
        return PrivacyAccountant(self.accountant, self.noise_multiplier, self.sample_rate, self.delta)
