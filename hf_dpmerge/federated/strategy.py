"""The Flower strategy: Poisson client sampling, aggregation by FedAvg or a merge kernel, optional
client-level DP, and a ledger of every client's privacy records and every round's client-level step.

Built on Flower's own strategies (``SERVER_STRATEGIES``): :class:`FederatedDPStrategy` on ``FedAvg``;
:class:`FederatedDPFedProx` on ``FedProx`` (Li et al., MLSys 2020: the round's config carries ``proximal-mu``
and each client adds (μ/2)·‖θ − θ_g‖² to its objective, ``DPSAMConfig.proximal_mu``: data-free, so any
aggregation and client-level DP still apply); :class:`FederatedDPFedAdam` on ``FedAdam`` (Reddi et al., ICLR
2021: Flower's server Adam step, :meth:`FederatedDPStrategy.server_step`, on the ``fedavg`` aggregate: FedAvg's
mean of the replies, or under client-level DP the noised mean, whose Adam step is post-processing)."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable

import numpy as np
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAdam, FedAvg, FedProx

from hf_dpmerge.federated.aggregation import (
    AGGREGATIONS,
    DEFAULT_DARE_DENSITY,
    DEFAULT_TIES_DENSITY,
    PRIVATE_AGGREGATIONS,
    ClientUpdate,
    merge_updates,
    private_aggregate,
)
from hf_dpmerge.federated.client import PRIVACY_RECORD_KEY
from hf_dpmerge.federated.client_level_dp import ClientLevelDP, sample_clients
from hf_dpmerge.records.record import PrivacyRecord

DEFAULT_SERVER_ETA = 1e-2  # FedAdam's server step η: a LoRA factor moves ≈ 1e-2 per round of 5 client steps
DEFAULT_SERVER_TAU = 1e-3  # FedAdam's τ, Flower's default


class FederatedDPStrategy(FedAvg):
    """FedAvg's messaging with Poisson sampling at rate ``client_sample_rate`` and our aggregation.

    ``aggregation`` is ``fedavg`` (Flower's weighted mean), ``task_arithmetic``, ``dp_aware`` or ``ties``
    (:mod:`hf_dpmerge.federated.aggregation`); with ``client_dp`` every round, sampled clients or none, is
    one step of the client-level Gaussian mechanism. ``records`` collects each client's per-round records.
    """

    def __init__(
        self,
        *,
        aggregation: str,
        client_sample_rate: float,
        server_learning_rate: float,
        client_dp: ClientLevelDP | None,
        generator: torch.Generator,
        ties_density: float = DEFAULT_TIES_DENSITY,
        dare_density: float = DEFAULT_DARE_DENSITY,
        **flower_options: float,
    ) -> None:
        super().__init__(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=0, min_available_nodes=1,
                         **flower_options)
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"--aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
        if not (math.isfinite(server_learning_rate) and server_learning_rate > 0):
            raise ValueError(f"--server_learning_rate must be a finite number > 0, got {server_learning_rate}")
        if aggregation == "fedavg" and server_learning_rate != 1 and client_dp is None:
            raise ValueError("fedavg is Flower's plain weighted mean: use --aggregation task_arithmetic for a "
                             "--server_learning_rate other than 1")
        if client_dp is not None and aggregation not in PRIVATE_AGGREGATIONS:
            raise ValueError(f"--aggregation {aggregation} cannot run under client-level DP (its sign election "
                             f"compares clients coordinate by coordinate): use one of {PRIVATE_AGGREGATIONS}")
        if not 0 < ties_density <= 1:
            raise ValueError(f"--ties_density must be in (0, 1], got {ties_density}")
        if not 0 < dare_density <= 1:
            raise ValueError(f"--dare_density must be in (0, 1], got {dare_density}")
        if client_dp is not None and client_dp.sample_rate != client_sample_rate:
            raise ValueError("the client-level mechanism must be accounted at the client sample rate")
        self.aggregation = aggregation
        self.client_sample_rate = client_sample_rate
        self.server_learning_rate = server_learning_rate
        self.client_dp = client_dp
        self.generator = generator
        self.ties_density = ties_density
        self.dare_density = dare_density
        self.records: dict[int, list[PrivacyRecord]] = defaultdict(list)
        self.sampled: dict[int, list[int]] = {}
        self._global: dict[str, torch.Tensor] = {}

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._global = arrays.to_torch_state_dict()
        nodes = sorted(grid.get_node_ids())
        chosen = sample_clients(nodes, self.client_sample_rate, self.generator)
        config["server-round"] = server_round
        content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return self._construct_messages(content, chosen, MessageType.TRAIN)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        valid, failed = self._check_and_log_replies(replies, is_train=True)
        if failed:
            reasons = "; ".join(f"node {m.metadata.src_node_id}: {m.error.reason}" for m in failed)
            raise RuntimeError(f"round {server_round}: {len(failed)} client(s) failed: {reasons}")
        updates = [self._client_update(message) for message in valid]
        self._check_updates(server_round, updates)
        self.sampled[server_round] = sorted(u.client for u in updates)
        for update in updates:
            self.records[update.client].append(update.record)
        metrics = MetricRecord({"sampled-clients": len(updates)})
        if updates:
            metrics["train-loss"] = sum(float(m.content["metrics"]["train-loss"]) for m in valid) / len(valid)
        if self.client_dp is not None:  # a round with no sampled client is a noise-only step
            state = private_aggregate(
                self._global, updates, method=self.aggregation, server_learning_rate=self.server_learning_rate,
                client_dp=self.client_dp, generator=self.generator, density=self.dare_density,
            )
        elif not updates:
            return None, metrics
        elif self.aggregation == "fedavg":  # Flower's FedAvg weighted mean
            arrays, _ = FedAvg.aggregate_train(self, server_round, valid)
            state = arrays.to_torch_state_dict()
        else:
            state = merge_updates(
                self._global, updates, method=self.aggregation, server_learning_rate=self.server_learning_rate,
                density=self.dare_density if self.aggregation == "dare" else self.ties_density,
                generator=self.generator,
            )
        stepped = self.server_step(server_round, state)
        return ArrayRecord({name: stepped[name].to(self._global[name].dtype) for name in stepped}), metrics

    def server_step(self, server_round: int, aggregate: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The new global state from the round's ``aggregate``: the aggregate itself (FedAvg, FedProx)."""
        return aggregate

    def _check_updates(self, server_round: int, updates: list[ClientUpdate]) -> None:
        """Refuse replies the strategy cannot aggregate (none here)."""

    @staticmethod
    def _client_update(message: Message) -> ClientUpdate:
        metrics = message.content["metrics"]
        client = int(metrics["client"])
        record = PrivacyRecord.from_dict(
            json.loads(message.content["privacy"][PRIVACY_RECORD_KEY]), source=f"client {client}'s reply"
        )
        return ClientUpdate(
            client=client, state=message.content["arrays"].to_torch_state_dict(),
            num_examples=int(metrics["num-examples"]), record=record,
        )


class FederatedDPFedProx(FederatedDPStrategy, FedProx):
    """:class:`FederatedDPStrategy` on Flower's ``FedProx``: every round's config carries ``proximal-mu``."""

    def __init__(self, *, proximal_mu: float, **settings) -> None:
        if not (math.isfinite(proximal_mu) and proximal_mu > 0):
            raise ValueError(f"--proximal_mu must be a finite number > 0 with --server_strategy fedprox, got "
                             f"{proximal_mu}")
        super().__init__(proximal_mu=proximal_mu, **settings)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        config["proximal-mu"] = self.proximal_mu  # what FedProx.configure_train sends, with our own sampling
        return super().configure_train(server_round, arrays, config, grid)

    def _check_updates(self, server_round: int, updates: list[ClientUpdate]) -> None:
        """The proximal term is the clients' to apply: refuse a reply whose record shows another μ."""
        for update in updates:
            if update.record.extra.get("proximal_mu", 0.0) != self.proximal_mu:
                raise RuntimeError(f"round {server_round}: client {update.client} trained with proximal_mu "
                                   f"{update.record.extra.get('proximal_mu', 0.0)}, not the round's {self.proximal_mu}")


class FederatedDPFedAdam(FederatedDPStrategy, FedAdam):
    """:class:`FederatedDPStrategy` on Flower's ``FedAdam``: its server Adam step (η = ``eta``, τ = ``tau``) on
    the ``fedavg`` aggregate, FedAvg's mean of the sampled clients or, under client-level DP, the noised mean."""

    def __init__(self, *, eta: float, tau: float, **settings) -> None:
        if settings.get("aggregation") != "fedavg":
            raise ValueError("--server_strategy fedadam takes Flower's server Adam step on the fedavg aggregate "
                             "(FedAvg's mean of the replies, or the noised mean under client-level DP): use it with "
                             "--aggregation fedavg")
        if not (math.isfinite(eta) and eta > 0 and math.isfinite(tau) and tau > 0):
            raise ValueError(f"--server_eta and --server_tau must be finite numbers > 0, got {eta} and {tau}")
        super().__init__(eta=eta, tau=tau, **settings)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.current_arrays = {name: array.numpy() for name, array in arrays.items()}  # as FedOpt.configure_train
        return super().configure_train(server_round, arrays, config, grid)

    def server_step(self, server_round: int, aggregate: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """FedAdam.aggregate_train's step on the pseudo-gradient Δ = aggregate − θ (FedOpt's Δ and m_t, then
        v_t and Flower's bias-corrected η_t): θ + η_t·m_t/(√v_t + τ). Under client-level DP the aggregates are the
        mechanism's outputs (the noised means) and m_t, v_t, never released, are functions of them only: the step
        is post-processing."""
        delta, m_t, _ = self._compute_deltat_and_mt(ArrayRecord(aggregate))
        if not self.v_t:
            self.v_t = {name: np.zeros_like(value) for name, value in delta.items()}
        self.v_t = {name: self.beta_2 * v + (1 - self.beta_2) * delta[name] ** 2 for name, v in self.v_t.items()}
        eta = self.eta * np.sqrt(1 - self.beta_2 ** (server_round + 1.0)) / (1 - self.beta_1 ** (server_round + 1.0))
        return {name: torch.from_numpy(np.asarray(x + eta * m_t[name] / (np.sqrt(self.v_t[name]) + self.tau)))
                for name, x in self.current_arrays.items()}


SERVER_STRATEGIES: dict[str, type[FederatedDPStrategy]] = {
    "fedavg": FederatedDPStrategy, "fedprox": FederatedDPFedProx, "fedadam": FederatedDPFedAdam,
}
