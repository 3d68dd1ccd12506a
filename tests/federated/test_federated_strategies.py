"""The server strategies on Flower's own (FedProx's round config, FedAdam's server step on the FedAvg mean) and the
DARE aggregation, on hand-built replies: no simulation engine."""

import json

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from hf_dpmerge.federated.aggregation import ClientUpdate, dare_update, merge_updates, private_aggregate
from hf_dpmerge.federated.client import PRIVACY_RECORD_KEY
from hf_dpmerge.federated.client_level_dp import ClientLevelDP
from hf_dpmerge.federated.strategy import SERVER_STRATEGIES
from tests.utils.records import privacy_record

STATES = [torch.tensor([1.0, -2.0, 0.5]), torch.tensor([2.0, 0.0, 0.5]), torch.tensor([3.0, 4.0, -1.0])]
SIZES = [10, 20, 30]


class _Grid:
    """What configure_train asks of Flower's Grid: the connected nodes."""

    def get_node_ids(self):
        return [11, 12, 13]


@pytest.fixture
def flower_run(monkeypatch):
    """Flower's message identity (set by its engine in a real run)."""
    from flwr.supercore.task_identity import TaskIdentity

    for field in ("_run_id", "_node_id", "_task_id"):
        monkeypatch.setattr(TaskIdentity, field, 1)


def _round(name: str, client_mu: float = 0.0, **options):
    """One round of strategy ``name`` from the global state 0: its train messages, and its aggregate of three
    replies (client k's state STATES[k] on SIZES[k] examples, trained with ``client_mu``)."""
    strategy = SERVER_STRATEGIES[name](aggregation="fedavg", client_sample_rate=1.0, server_learning_rate=1.0,
                                       client_dp=None, generator=torch.Generator().manual_seed(0), **options)
    messages = list(strategy.configure_train(1, ArrayRecord({"w": torch.zeros(3)}), ConfigRecord({}), _Grid()))
    trained = privacy_record("t")
    if client_mu:
        trained.extra["proximal_mu"] = client_mu
    record = json.dumps(trained.to_dict())
    replies = [Message(content=RecordDict({
        "arrays": ArrayRecord({"w": state}), "privacy": ConfigRecord({PRIVACY_RECORD_KEY: record}),
        "metrics": MetricRecord({"num-examples": size, "train-loss": 0.5, "client": k})}), reply_to=message)
        for k, (state, size, message) in enumerate(zip(STATES, SIZES, messages))]
    arrays, _ = strategy.aggregate_train(1, replies)
    return messages, arrays.to_torch_state_dict()["w"]


def _fedavg_mean() -> torch.Tensor:
    return sum(size * state for size, state in zip(SIZES, STATES)) / sum(SIZES)


def test_fedprox_sends_mu_in_every_round_config_and_averages_like_fedavg(flower_run):
    messages, merged = _round("fedprox", client_mu=0.3, proximal_mu=0.3)
    assert [m.content["config"]["proximal-mu"] for m in messages] == [0.3] * 3
    torch.testing.assert_close(merged, _fedavg_mean())
    with pytest.raises(RuntimeError, match="client 0 trained with proximal_mu 0.0, not the round's 0.3"):
        _round("fedprox", proximal_mu=0.3)  # replies whose records show no proximal term
    messages, _ = _round("fedavg")
    assert "proximal-mu" not in messages[0].content["config"]


def test_fedadam_takes_flowers_server_adam_step_on_the_fedavg_mean(flower_run):
    """Round 1 from θ = 0: Δ = the weighted mean, m = (1 − β1)·Δ, v = (1 − β2)·Δ², θ' = θ + η_t·m/(√v + τ) with
    η_t = η·√(1 − β2²)/(1 − β1²) (Flower's bias-corrected rate at round 1); the global dtype is kept."""
    eta, tau, beta1, beta2 = 0.01, 1e-3, 0.9, 0.99
    _, merged = _round("fedadam", eta=eta, tau=tau)
    delta = _fedavg_mean().double()
    m, v = (1 - beta1) * delta, (1 - beta2) * delta**2
    expected = eta * (1 - beta2**2) ** 0.5 / (1 - beta1**2) * m / (v.sqrt() + tau)
    assert merged.dtype == torch.float32
    torch.testing.assert_close(merged.double(), expected, rtol=1e-6, atol=1e-7)


def test_dare_keeps_each_coordinate_with_probability_density_and_is_unbiased():
    delta = torch.linspace(-1, 1, 50)
    generator = torch.Generator().manual_seed(0)
    draws = torch.stack([dare_update(delta, 0.25, generator) for _ in range(8000)])
    kept = draws != 0
    assert abs(kept.float().mean().item() - 0.25) < 0.005
    torch.testing.assert_close(draws[kept], (delta.expand_as(draws) / 0.25)[kept])  # kept: rescaled by 1/p
    # E[DARE(Δ)] = Δ: the mean of 8000 draws has a standard error of |Δ|·√((1 − p)/p)/√8000 ≈ 0.019·|Δ|
    assert ((draws.mean(0) - delta).abs() <= 0.1 * delta.abs() + 1e-6).all()


def test_dare_aggregation_is_the_mean_of_each_clients_dropped_and_rescaled_update():
    base = {"w": torch.ones(3)}
    updates = [ClientUpdate(client=k, state={"w": base["w"] + s}, num_examples=n, record=None)
               for k, (s, n) in enumerate(zip(STATES, SIZES))]
    merged = merge_updates(base, updates, method="dare", server_learning_rate=0.5, density=0.5,
                           generator=torch.Generator().manual_seed(3))
    again = torch.Generator().manual_seed(3)
    expected = base["w"] + 0.5 * torch.stack([dare_update(s, 0.5, again) for s in STATES]).mean(0)
    torch.testing.assert_close(merged["w"], expected)
    # under client-level DP each client's DARE(Δ_k) is what is clipped and summed (here: no clipping, and noise
    # of std 1e-10)
    released = private_aggregate(base, updates, method="dare", server_learning_rate=1.0, density=0.5,
                                 client_dp=ClientLevelDP(noise_multiplier=1e-12, clip_norm=100.0, sample_rate=1.0,
                                                         num_clients=3),
                                 generator=torch.Generator().manual_seed(3))
    again = torch.Generator().manual_seed(3)
    torch.testing.assert_close(released["w"], base["w"] + torch.stack([dare_update(s, 0.5, again)
                                                                          for s in STATES]).sum(0) / 3)
