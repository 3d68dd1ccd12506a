"""Server-side aggregation of client LoRA updates with hf_dpmerge's merge kernels.

Client k's update is Δ_k = θ_k − θ_g (its trained LoRA factors and head against the global state). ``fedavg``
is Flower's own; ``task_arithmetic`` is θ_g + λ·Σ_k Δ_k/K; ``dp_aware`` SURE-denoises each Δ_k at its record's
noise and weights by random effects (docs/design.md §6); ``ties`` is TIES (Yadav et al., NeurIPS 2023,
arXiv:2306.01708) and ``dare`` θ_g + λ·Σ_k DARE(Δ_k)/K (Yu et al., ICML 2024, arXiv:2311.03099). Under
client-level DP (:mod:`~hf_dpmerge.federated.client_level_dp`) the server releases
θ_g + λ·(Σ_k clip_S(u_k) + N(0, z²S²I))/(q·K), u_k the client's own post-processed update, with uniform weights
(data-dependent ones would leave the sensitivity unbounded). See docs/design.md §12.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from hf_dpmerge.federated.client_level_dp import ClientLevelDP, private_mean_update
from hf_dpmerge.merging.methods.dp_aware import dp_aware_merge
from hf_dpmerge.noise.variance import record_noise_variance
from hf_dpmerge.records.record import PrivacyRecord

AGGREGATIONS = ("fedavg", "task_arithmetic", "dp_aware", "ties", "dare")
# what a client-level mechanism can release: not ties, whose sign election compares clients coordinate by
# coordinate, so no clipped sum bounds one client's influence
PRIVATE_AGGREGATIONS = ("fedavg", "task_arithmetic", "dp_aware", "dare")
DEFAULT_TIES_DENSITY = 0.2
DEFAULT_DARE_DENSITY = 0.5
HEAD_MARKER = ".modules_to_save."

State = Mapping[str, torch.Tensor]


@dataclass
class ClientUpdate:
    """One sampled client's reply: its identity, trained state θ_k, shard size and the round's record."""

    client: int
    state: dict[str, torch.Tensor]
    num_examples: int
    record: PrivacyRecord


def tensor_noise_variance(record: PrivacyRecord, name: str) -> float:
    """s² the client's DP-SGD left in tensor ``name``: the record's (encoder) value, scaled by
    (head_lr/lr)² for the task head, which steps at its own learning rate."""
    return record_noise_variance(record, head=HEAD_MARKER in name)


def _check_states(global_state: State, updates: Sequence[ClientUpdate]) -> None:
    for update in updates:
        if set(update.state) != set(global_state):
            differing = sorted(set(update.state) ^ set(global_state))
            raise ValueError(f"client {update.client} returned tensors that differ from the global state: {differing}")


def ties_update(deltas: Sequence[torch.Tensor], density: float) -> torch.Tensor:
    """TIES of client updates: trim each to ``density``, elect signs by the trimmed sum, disjoint mean."""
    from mergekit.merge_methods.generalized_task_arithmetic import get_mask
    from mergekit.sparsify import SparsificationMethod, sparsify

    trimmed = torch.stack([sparsify(d.float(), density, SparsificationMethod.magnitude) for d in deltas])
    agree = get_mask(trimmed, method="sum") & (trimmed != 0)
    return (trimmed * agree).sum(0) / agree.sum(0).clamp(min=1)


def dare_update(delta: torch.Tensor, density: float, generator: torch.Generator) -> torch.Tensor:
    """DARE(Δ) = m ⊙ Δ / density, m_i ~ Bernoulli(density) drawn from ``generator`` (unbiased: E = Δ)."""
    # one client's update is transformed on its own (so under client-level DP DARE(Δ_k) is clipped and noised like
    # Δ_k); the rescaling also multiplies the client's own DP noise by 1/density on the kept coordinates
    keep = torch.rand(delta.shape, generator=generator) < density
    return torch.where(keep, delta.float() / density, torch.zeros((), dtype=torch.float32))


def merge_updates(
    global_state: State, updates: Sequence[ClientUpdate], *, method: str, server_learning_rate: float,
    density: float = DEFAULT_TIES_DENSITY, generator: torch.Generator | None = None,
) -> dict[str, torch.Tensor]:
    """The new global state from the sampled clients' states (no client-level DP), ``task_arithmetic``,
    ``dp_aware``, ``ties`` (at ``density``) or ``dare`` (at ``density``, drawn from ``generator``); ``fedavg``
    is Flower's aggregation."""
    if method not in ("task_arithmetic", "dp_aware", "ties", "dare"):
        raise ValueError(f"merge_updates handles task_arithmetic, dp_aware, ties and dare, not {method!r}")
    if method == "dare" and generator is None:
        raise ValueError("dare needs the server's generator (its drops are random)")
    _check_states(global_state, updates)
    if not updates:
        return dict(global_state)
    if method == "ties":
        return {name: (base.float() + server_learning_rate * ties_update(
                    [u.state[name].float() - base.float() for u in updates], density)).to(base.dtype)
                for name, base in global_state.items()}
    if method == "dare":
        contributions = [client_contribution(global_state, u, method, density, generator) for u in updates]
        return {name: (base.float() + server_learning_rate * torch.stack([c[name] for c in contributions]).mean(0)
                       ).to(base.dtype) for name, base in global_state.items()}
    weights = [1.0 / len(updates)] * len(updates)
    # the dp_aware kernel with zero noise variances and task_arithmetic weighting is exactly task arithmetic
    merged = {}
    for name, base in global_state.items():
        variances = [tensor_noise_variance(u.record, name) if method == "dp_aware" else 0.0 for u in updates]
        merged[name] = dp_aware_merge(
            base, [u.state[name] for u in updates], variances, weights=weights, lam=server_learning_rate,
            weighting="random_effects" if method == "dp_aware" else "task_arithmetic", shrinkage="soft_threshold",
        )
    return merged


def client_contribution(global_state: State, update: ClientUpdate, method: str, density: float = 1.0,
                        generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """u_k: Δ_k, for ``dp_aware`` its SURE-denoised estimate (the kernel applied to one input), for ``dare``
    DARE(Δ_k) at ``density`` (drawn from ``generator``)."""
    contribution = {}
    for name, base in global_state.items():
        delta = update.state[name].float() - base.float()
        if method == "dare":
            delta = dare_update(delta, density, generator)
        elif method == "dp_aware":
            variance = tensor_noise_variance(update.record, name)
            delta = dp_aware_merge(torch.zeros_like(delta), [delta], [variance], weights=[1.0], lam=1.0,
                                   shrinkage="soft_threshold")
        contribution[name] = delta
    return contribution


def private_aggregate(
    global_state: State,
    updates: Sequence[ClientUpdate],
    *,
    method: str,
    server_learning_rate: float,
    client_dp: ClientLevelDP,
    generator: torch.Generator,
    density: float = DEFAULT_DARE_DENSITY,
) -> dict[str, torch.Tensor]:
    """θ_g + λ·(Σ_k clip_S(u_k) + N(0, z²S²I))/(q·K): one round of the client-level Gaussian mechanism
    (``density``: DARE's, for ``dare``)."""
    if method not in PRIVATE_AGGREGATIONS:
        raise ValueError(f"under client-level DP the aggregation must be one of {PRIVATE_AGGREGATIONS}, got "
                         f"{method!r}")
    _check_states(global_state, updates)
    mean = private_mean_update(
        [client_contribution(global_state, u, method, density, generator) for u in updates],
        global_state,
        clip_norm=client_dp.clip_norm,
        noise_multiplier=client_dp.noise_multiplier,
        expected_clients=client_dp.expected_clients,
        generator=generator,
    )
    return {
        name: (base.float() + server_learning_rate * mean[name]).to(base.dtype) for name, base in global_state.items()
    }
