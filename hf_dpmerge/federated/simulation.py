"""Run a federation in Flower's simulation engine and release its global adapter with both guarantees.

``run_federated`` builds the ServerApp (the strategy of :mod:`~hf_dpmerge.federated.strategy`, with the
global model evaluated centrally on the validation split after every round) and the ClientApp
(:mod:`~hf_dpmerge.federated.client`) and runs them with ``flwr.simulation.run_simulation`` (Ray backend,
one virtual SuperNode per client). ``output_dir`` then holds a run like ``examples/train_glue.py`` writes
one: ``adapter/`` (global LoRA + head + ``dp_privacy.json``), ``encoder_adapter/``, ``eval_metrics.json``
(the final global model on the test split, evaluated once), plus ``federated_privacy.json``: the server's
ledger (per-client composition, the clients sampled and the validation metric per round). Under
client-level DP the ledger reveals participation, which the guarantee assumes secret: publish
``adapter/`` (its record states both levels without it), not the ledger.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from hf_dpmerge.analysis.evaluation import predict_logits
from hf_dpmerge.data import compute_metrics, predictions_from_logits
from hf_dpmerge.federated.aggregation import DEFAULT_DARE_DENSITY, DEFAULT_TIES_DENSITY
from hf_dpmerge.federated.client import build_client_app
from hf_dpmerge.federated.client_level_dp import ClientLevelDP
from hf_dpmerge.federated.federation import (
    FederatedSetup,
    client_shard,
    load_trainable_state,
    task_data,
    trainable_state,
)
from hf_dpmerge.federated.guarantee import (
    client_example_level,
    federated_guarantee,
    planned_client_records,
    released_guarantee,
)
from hf_dpmerge.federated.strategy import (
    DEFAULT_SERVER_ETA,
    DEFAULT_SERVER_TAU,
    SERVER_STRATEGIES,
    FederatedDPStrategy,
)
from hf_dpmerge.records.card import write_adapter_card
from hf_dpmerge.records.record import PrivacyRecord
from hf_dpmerge.records.release_files import check_release_target, release_adapter
from hf_dpmerge.records.run_folders import ADAPTER_DIR, ENCODER_ADAPTER_DIR, EVAL_METRICS_NAME
from hf_dpmerge.training.dp.accounting import replace_one_epsilon
from hf_dpmerge.training.encoder_adapter import export_encoder_adapter
from hf_dpmerge.utils.adapter_files import set_adapter_base
from hf_dpmerge.utils.io import write_text_atomic

FEDERATED_RECORD_NAME = "federated_privacy.json"


@dataclass(frozen=True)
class ServerSettings:
    """The server's choices: Flower strategy (``fedavg``, ``fedprox`` with μ, ``fedadam`` with η and τ),
    aggregation, server learning rate λ, client sample rate q, client-level DP."""

    aggregation: str = "fedavg"
    server_learning_rate: float = 1.0
    client_sample_rate: float = 1.0
    client_dp: ClientLevelDP | None = None
    concurrent_clients: int = 1
    ties_density: float = DEFAULT_TIES_DENSITY
    dare_density: float = DEFAULT_DARE_DENSITY
    server_strategy: str = "fedavg"
    proximal_mu: float = 0.0
    server_eta: float = DEFAULT_SERVER_ETA
    server_tau: float = DEFAULT_SERVER_TAU

    def strategy(self, generator: torch.Generator) -> FederatedDPStrategy:
        """The Flower strategy these settings describe (errors name the flag to change)."""
        if self.server_strategy not in SERVER_STRATEGIES:
            raise ValueError(f"--server_strategy must be one of {sorted(SERVER_STRATEGIES)}, got "
                             f"{self.server_strategy!r}")
        if self.proximal_mu and self.server_strategy != "fedprox":
            raise ValueError("--proximal_mu is FedProx's: pass --server_strategy fedprox with it")
        options = {"fedprox": {"proximal_mu": self.proximal_mu},
                   "fedadam": {"eta": self.server_eta, "tau": self.server_tau}}.get(self.server_strategy, {})
        return SERVER_STRATEGIES[self.server_strategy](
            aggregation=self.aggregation, client_sample_rate=self.client_sample_rate,
            server_learning_rate=self.server_learning_rate, client_dp=self.client_dp, generator=generator,
            ties_density=self.ties_density, dare_density=self.dare_density, **options,
        )


def evaluate_state(setup: FederatedSetup, model: torch.nn.Module, state: dict, split: str) -> dict[str, float]:
    """The task metric of ``model`` with the federated ``state`` loaded, on ``split``."""
    data, spec, tokenizer = task_data(setup)
    load_trainable_state(model, state)
    model.eval()
    logits = predict_logits(model, data[split], tokenizer)
    return compute_metrics(spec, predictions_from_logits(spec, logits), data[split]["labels"])


def global_record(
    setup: FederatedSetup, strategy: FederatedDPStrategy, client_dp: ClientLevelDP | None, shard_sizes: list[int]
) -> PrivacyRecord:
    """The global adapter's ``dp_privacy.json``: the released example-level guarantee (ε and δ, the maxima over
    the clients, and ε under replace-one, the largest of the clients' over their steps at that δ), the noise
    fields of the client with the largest ε (its Σ η² over its steps bounds the averaged global state's
    noise) and both levels under ``extra["federated"]`` (:func:`released_guarantee`). Under client-level DP the
    clients are every registered client's :func:`planned_client_records` (``shard_sizes``: each client's shard
    size), so no field depends on who was sampled."""
    if not strategy.records:
        raise ValueError("no client trained in any round: nothing to release (raise --client_sample_rate)")
    if client_dp is not None:
        clients = planned_client_records(setup, shard_sizes, strategy.records)
        released = released_guarantee(strategy.records, client_dp, setup.rounds, clients)
    else:
        released = released_guarantee(strategy.records, None, setup.rounds)
        clients = {c: dataclasses.replace(records[-1], steps=sum(r.steps for r in records),
                                          sum_lr_squared=sum(r.sum_lr_squared for r in records))
                   for c, records in strategy.records.items()}  # each client's rounds as one run at its σ and q
    delta = released["example_level"]["delta"]
    client = max(clients, key=lambda c: client_example_level(c, [clients[c]]).epsilon)
    replace_one = max(replace_one_epsilon(effective_noise_multiplier=r.effective_noise_multiplier,
                                          sample_rate=r.sample_rate, steps=r.steps, delta=delta)
                      for r in clients.values())
    return PrivacyRecord.from_dict({
        **clients[client].to_dict(), "epsilon": released["example_level"]["epsilon"], "delta": delta,
        "epsilon_replace_one": replace_one, "task": setup.task, "extra": {"federated": released},
    }, source="federated global record")


def run_federated(setup: FederatedSetup, server: ServerSettings, output_dir: str | os.PathLike,
                  overwrite: bool = False) -> dict[str, Any]:
    """Simulate the federation, write ``output_dir`` and return the contents of its federated record."""
    if server.concurrent_clients < 1:
        raise ValueError(f"--concurrent_clients must be ≥ 1, got {server.concurrent_clients}")
    output_dir = Path(output_dir)
    check_release_target(output_dir / ADAPTER_DIR, overwrite)  # refuse before training, not after
    generator = torch.Generator()
    seed = setup.dp_seed if setup.dp_seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
    generator.manual_seed(seed)
    strategy = server.strategy(generator)
    _, spec, _ = task_data(setup)
    # every shard fits the batch (refused here, not inside a client); their sizes are public configuration
    shard_sizes = [len(client_shard(setup, client)) for client in range(setup.num_clients)]
    server_model = setup.model(spec)
    initial = trainable_state(server_model)
    outcome: dict[str, Any] = {}

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        metrics = evaluate_state(setup, server_model, arrays.to_torch_state_dict(), "validation")
        return MetricRecord({spec.metric: metrics[spec.metric]})

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        outcome["result"] = strategy.start(
            grid=grid, initial_arrays=ArrayRecord(initial), num_rounds=setup.rounds, evaluate_fn=evaluate
        )

    run_simulation(
        server_app=app, client_app=build_client_app(setup), num_supernodes=setup.num_clients,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": server.concurrent_clients, "log_to_driver": False,
                          "logging_level": logging.WARNING},
        },
    )
    if "result" not in outcome:
        raise RuntimeError("the Flower simulation ended without running the server: see its log above")
    result = outcome["result"]
    final_state = result.arrays.to_torch_state_dict() if result.arrays is not None else initial
    guarantee = federated_guarantee(strategy.records, server.client_dp, setup.rounds)
    history = [
        {"round": r, "sampled_clients": strategy.sampled.get(r, []),
         spec.metric: float(result.evaluate_metrics_serverapp[r][spec.metric])}
        for r in sorted(result.evaluate_metrics_serverapp)
    ]
    record = global_record(setup, strategy, server.client_dp, shard_sizes)
    summary = {
        "task": setup.task, "setup": asdict(setup), "server": asdict(server), "guarantee": guarantee,
        "released": record.extra["federated"], "history": history,
        "test": evaluate_state(setup, server_model, final_state, "test"),
    }
    _release(setup, server_model, final_state, record, output_dir, overwrite)
    write_text_atomic(output_dir / FEDERATED_RECORD_NAME, json.dumps(summary, indent=2, allow_nan=True) + "\n")
    eval_summary = {"task": setup.task, "test": summary["test"], "epsilon": record.epsilon,
                    "delta": record.delta, "client_level": summary["released"]["client_level"]}
    write_text_atomic(output_dir / EVAL_METRICS_NAME, json.dumps(eval_summary, indent=2, allow_nan=True) + "\n")
    return summary


def _release(setup: FederatedSetup, model, state: dict, record: PrivacyRecord, output_dir: Path,
             overwrite: bool) -> None:
    load_trainable_state(model, state)

    def write(directory: Path) -> None:
        model.save_pretrained(directory)
        set_adapter_base(directory, record.base_model)  # a Hub id or nothing: no path of this machine
        record.save(directory)
        write_adapter_card(directory, record, f"{setup.task} (federated)")  # both levels, from the record

    release_adapter(output_dir / ADAPTER_DIR, write, overwrite)
    export_encoder_adapter(output_dir / ADAPTER_DIR, output_dir / ENCODER_ADAPTER_DIR)
