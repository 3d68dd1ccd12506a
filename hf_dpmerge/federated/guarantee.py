"""The two guarantees of a federated run, accounted with opacus' accountants (docs/design.md §12).

Example level: all of client k's DP-SGD steps over all rounds are one adaptive sequence of subsampled Gaussian
mechanisms on its shard, so ONE accountant over its T_k steps gives (ε_k, δ_k); shards are disjoint, so the
global model is (max_k ε_k, max_k δ_k)-DP per example. Client level (server-side DP only): R rounds at (z, q)
(:mod:`~hf_dpmerge.federated.client_level_dp`), ``epsilon`` under add/remove-one client and
``epsilon_replace_one`` under replace-one (PLD, docs/design.md §9). The released record
(:func:`released_guarantee`) never depends on which clients were sampled, which must stay secret for subsampling
to amplify: it is computed from public configuration as if every registered client trained in every round
(:func:`planned_client_records`); the per-round ledger (:func:`federated_guarantee`) is the server's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from hf_dpmerge.federated.client_level_dp import ClientLevelDP
from hf_dpmerge.records.record import ADD_REMOVE_ONE, PrivacyRecord
from hf_dpmerge.training.dp.accounting import PrivacyAccountant, replace_one_epsilon, resolve_delta

if TYPE_CHECKING:
    from hf_dpmerge.federated.federation import FederatedSetup

CLIENT_UNIT = "client (its whole shard)"
CLIENT_FIELDS = ("epsilon", "delta", "epsilon_replace_one", "noise_multiplier", "effective_noise_multiplier",
                 "sample_rate", "num_samples", "num_units")
"""The record fields that differ between clients (through their shard sizes)."""
ROUND_FIELDS = ("steps", "sum_lr_squared")
"""The fields of one client round that count its steps; every field but these and :data:`CLIENT_FIELDS` is the
federation's configuration, the same in every client's every round."""


@dataclass(frozen=True)
class ClientExampleLevel:
    """Client ``client``'s example-level guarantee after ``rounds_trained`` rounds and ``steps`` DP-SGD steps."""

    client: int
    num_samples: int
    sample_rate: float
    noise_multiplier: float
    accountant: str
    rounds_trained: int
    steps: int
    epsilon: float
    delta: float


def client_example_level(
    client: int, records: Sequence[PrivacyRecord], steps: int | None = None
) -> ClientExampleLevel:
    """Compose client ``client``'s per-round records: one accountant over all their steps (or over
    ``steps`` steps at the same σ and q, e.g. the worst case of training in every round)."""
    if not records:
        raise ValueError(f"client {client} has no privacy records")
    first = records[0]
    for record in records[1:]:
        for key in ("effective_noise_multiplier", "sample_rate", "delta", "accountant", "num_samples"):
            if getattr(record, key) != getattr(first, key):
                raise ValueError(
                    f"client {client}'s rounds differ in {key} ({getattr(first, key)!r} vs "
                    f"{getattr(record, key)!r}): they cannot be composed in one accountant"
                )
    # the global state a round starts from is post-processing of earlier releases and of other clients' data, so
    # one accountant over all steps is valid and tighter than summing per-round ε (RDP/PRV compose sub-additively)
    steps = sum(record.steps for record in records) if steps is None else steps
    accountant = PrivacyAccountant(first.accountant, first.effective_noise_multiplier, first.sample_rate, first.delta)
    return ClientExampleLevel(
        client=client, num_samples=first.num_samples, sample_rate=first.sample_rate,
        noise_multiplier=first.noise_multiplier, accountant=first.accountant, rounds_trained=len(records),
        steps=steps, epsilon=accountant.epsilon_after(steps), delta=first.delta,
    )


def client_level_guarantee(client_dp: ClientLevelDP, rounds: int) -> dict[str, Any]:
    """(ε, δ) of ``rounds`` rounds of the server's mechanism under add/remove-one client, its replace-one ε
    at the same δ, and its parameters."""
    accountant = client_dp.accountant_for_rounds()
    return {
        "epsilon": accountant.epsilon_after(rounds), "delta": client_dp.delta, "rounds": rounds,
        "privacy_unit": CLIENT_UNIT, "neighbouring_relation": ADD_REMOVE_ONE,
        "epsilon_replace_one": replace_one_epsilon(
            effective_noise_multiplier=client_dp.noise_multiplier, sample_rate=client_dp.sample_rate,
            steps=rounds, delta=client_dp.delta,
        ),
        "allow_large_delta": client_dp.allow_large_delta,
        "noise_multiplier": client_dp.noise_multiplier, "clip_norm": client_dp.clip_norm,
        "sample_rate": client_dp.sample_rate, "num_clients": client_dp.num_clients,
        "expected_clients": client_dp.expected_clients, "accountant": client_dp.accountant,
    }


def federated_guarantee(
    records_by_client: Mapping[int, Sequence[PrivacyRecord]], client_dp: ClientLevelDP | None, rounds: int
) -> dict[str, Any]:
    """Both levels: per-client example-level guarantees, their maximum, and the client-level one (or None)."""
    per_client = [client_example_level(client, records_by_client[client]) for client in sorted(records_by_client)]
    return {
        "example_level": {
            "epsilon": max((c.epsilon for c in per_client), default=0.0),
            "delta": max((c.delta for c in per_client), default=0.0),
            "composition": "per client: one accountant over all its DP-SGD steps in all rounds; "
                           "across clients: parallel (disjoint shards) → max",
            "clients": [asdict(c) for c in per_client],
        },
        "client_level": client_level_guarantee(client_dp, rounds) if client_dp is not None else None,
    }


def planned_client_records(
    setup: FederatedSetup, shard_sizes: Sequence[int], records_by_client: Mapping[int, Sequence[PrivacyRecord]]
) -> dict[int, PrivacyRecord]:
    """Every registered client's record as if it were sampled in every round (``setup.rounds`` ×
    ``setup.local_steps`` steps), from public configuration only: client k's shard size ``shard_sizes[k]``
    gives its σ (:meth:`FederatedSetup.client_noise_multiplier`), q = batch_size/N_k and δ; Σ η² is the clients'
    constant learning rate squared per step. The settings every client shares (the record's other fields) are
    read from the round records of the clients that trained, which must agree on them and with their own public
    values (at most ``local_steps`` steps a round, at that rate), so whichever clients trained gives the same
    result."""
    rounds = [record for client in sorted(records_by_client) for record in records_by_client[client]]
    if not rounds:
        raise ValueError("the clients' shared settings come from their round records: no client trained")
    shared = {k: v for k, v in rounds[0].to_dict().items() if k not in CLIENT_FIELDS + ROUND_FIELDS}
    planned, lr_squared = setup.rounds * setup.local_steps, setup.learning_rate**2  # client.py: constant schedule
    public = {}
    for client, size in enumerate(shard_sizes):
        sigma = setup.client_noise_multiplier(size)
        effective = sigma / math.sqrt(shared["queries_per_step"])
        sample_rate, delta = setup.batch_size / size, resolve_delta(setup.target_delta, size)
        public[client] = PrivacyRecord.from_dict({
            **shared, "num_samples": size, "num_units": size, "noise_multiplier": sigma,
            "effective_noise_multiplier": effective, "sample_rate": sample_rate, "delta": delta, "steps": planned,
            "sum_lr_squared": planned * lr_squared,
            "epsilon": PrivacyAccountant(shared["accountant"], effective, sample_rate, delta).epsilon_after(planned),
            "epsilon_replace_one": replace_one_epsilon(effective_noise_multiplier=effective, sample_rate=sample_rate,
                                                       steps=planned, delta=delta),
        }, source=f"client {client}'s planned record")
    for client, records in records_by_client.items():
        for record in records:
            differing = [key for key, value in record.to_dict().items()
                         if key not in ("epsilon", "epsilon_replace_one", *ROUND_FIELDS)
                         and value != getattr(public[client], key)]
            if record.steps > setup.local_steps or not math.isclose(
                    record.sum_lr_squared, record.steps * lr_squared, rel_tol=1e-9):
                differing += list(ROUND_FIELDS)
            if differing:
                raise RuntimeError(f"client {client}'s round record differs from the federation's public "
                                   f"configuration in {differing}: the release cannot be stated without it")
    return public


def released_guarantee(
    records_by_client: Mapping[int, Sequence[PrivacyRecord]],
    client_dp: ClientLevelDP | None,
    rounds: int,
    planned: Mapping[int, PrivacyRecord] | None = None,
) -> dict[str, Any]:
    """Both levels as the global adapter's record states them, without participation: with client-level DP
    every value comes from ``planned`` (:func:`planned_client_records` of every registered client, required),
    without it from the clients' ``records_by_client``."""
    hidden = client_dp is not None
    if hidden and planned is None:
        raise ValueError("under client-level DP the release is stated from every registered client's planned record")
    per_client = ([client_example_level(client, [planned[client]]) for client in sorted(planned)] if hidden else
                  [client_example_level(client, records_by_client[client]) for client in sorted(records_by_client)])
    return {
        "example_level": {
            "epsilon": max((c.epsilon for c in per_client), default=0.0),
            "delta": max((c.delta for c in per_client), default=0.0),
            "steps_accounted": "every client sampled in every round (participation stays secret)" if hidden
            else "each client's steps in all its rounds; max over clients (disjoint shards)",
        },
        "client_level": client_level_guarantee(client_dp, rounds) if hidden else None,
    }
