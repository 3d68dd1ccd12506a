"""The server strategies on Flower's own (FedProx's round config, FedAdam's server step on the FedAvg mean) and the
DARE aggregation, on hand-built replies: no simulation engine."""

import json

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from opacus.accountants import RDPAccountant

from hf_dpmerge.federated.aggregation import ClientUpdate, dare_update, merge_updates, private_aggregate
from hf_dpmerge.federated.client import PRIVACY_RECORD_KEY
from hf_dpmerge.federated.client_level_dp import ClientLevelDP
from hf_dpmerge.federated.federation import FederatedSetup
from hf_dpmerge.federated.guarantee import client_level_guarantee
from hf_dpmerge.federated.simulation import global_record
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


def _round(name: str, client_mu: float = 0.0, client_dp: ClientLevelDP | None = None, **options):
    """One round of strategy ``name`` from the global state 0: its train messages, its aggregate of three
    replies (client k's state STATES[k] on SIZES[k] examples, trained with ``client_mu``), under ``client_dp``,
    and the strategy."""
    strategy = SERVER_STRATEGIES[name](aggregation="fedavg", client_sample_rate=1.0, server_learning_rate=1.0,
                                       client_dp=client_dp, generator=torch.Generator().manual_seed(0), **options)
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
    return messages, arrays.to_torch_state_dict()["w"], strategy


def _fedavg_mean() -> torch.Tensor:
    return sum(size * state for size, state in zip(SIZES, STATES)) / sum(SIZES)


def test_fedprox_sends_mu_in_every_round_config_and_averages_like_fedavg(flower_run):
    messages, merged, _ = _round("fedprox", client_mu=0.3, proximal_mu=0.3)
    assert [m.content["config"]["proximal-mu"] for m in messages] == [0.3] * 3
    torch.testing.assert_close(merged, _fedavg_mean())
    with pytest.raises(RuntimeError, match="client 0 trained with proximal_mu 0.0, not the round's 0.3"):
        _round("fedprox", proximal_mu=0.3)  # replies whose records show no proximal term
    messages, _, _ = _round("fedavg")
    assert "proximal-mu" not in messages[0].content["config"]


def test_fedadam_takes_flowers_server_adam_step_on_the_fedavg_mean(flower_run):
    """Round 1 from θ = 0: Δ = the weighted mean, m = (1 − β1)·Δ, v = (1 − β2)·Δ², θ' = θ + η_t·m/(√v + τ) with
    η_t = η·√(1 − β2²)/(1 − β1²) (Flower's bias-corrected rate at round 1); the global dtype is kept."""
    _, merged, _ = _round("fedadam", eta=0.01, tau=1e-3)
    assert merged.dtype == torch.float32
    torch.testing.assert_close(merged.double(), _adam_step(_fedavg_mean().double(), 0.01, 1e-3), rtol=1e-6, atol=1e-7)


def _adam_step(delta: torch.Tensor, eta: float, tau: float) -> torch.Tensor:
    """Round 1 of FedAdam from θ = 0 on the pseudo-gradient Δ (Flower's bias-corrected η_t, β1 = 0.9, β2 = 0.99)."""
    m, v = 0.1 * delta, 0.01 * delta**2
    return eta * (1 - 0.99**2) ** 0.5 / (1 - 0.9**2) * m / (v.sqrt() + tau)


def test_fedadam_under_client_level_dp_steps_on_the_noised_mean_and_keeps_the_guarantee(flower_run):
    """Allowed under client-level DP: the server Adam step is taken on the released (clipped, noised) mean, so it
    is post-processing; the mechanism, hence both guarantees, is FedAvg's under the same client DP."""
    mechanism = ClientLevelDP(noise_multiplier=1e-12, clip_norm=100.0, sample_rate=1.0, num_clients=3)
    _, merged, _ = _round("fedadam", client_dp=mechanism, eta=0.01, tau=1e-3)
    _, private_mean, _ = _round("fedavg", client_dp=mechanism)
    noised_mean = sum(STATES) / 3  # Σ clip_S(Δ_k)/(q·K): uniform, not FedAvg's N_k weights; noise of std 3e-11
    torch.testing.assert_close(private_mean, noised_mean)
    torch.testing.assert_close(merged.double(), _adam_step(noised_mean.double(), 0.01, 1e-3), rtol=1e-6, atol=1e-7)
    assert not torch.allclose(merged.double(), _adam_step(_fedavg_mean().double(), 0.01, 1e-3))
    # the released record (privacy_record's rounds: 100 steps at σ 0.9, q 32/1600, δ 1e-5, Σ η² 0.01) is FedAvg's
    mechanism = ClientLevelDP(noise_multiplier=1.0, clip_norm=0.1, sample_rate=1.0, num_clients=3, accountant="rdp")
    setup = FederatedSetup(task="rotten_tomatoes", base="unused", num_clients=3, rounds=1, local_steps=100,
                           batch_size=32, noise_multiplier=0.9, target_delta=1e-5, learning_rate=0.01)
    adam, avg = (global_record(setup, _round(name, client_dp=mechanism, **options)[2], mechanism, [1600] * 3)
                 for name, options in (("fedadam", {"eta": 0.01, "tau": 1e-3}), ("fedavg", {})))
    assert adam.to_dict() == avg.to_dict()
    assert adam.extra["federated"]["client_level"] == client_level_guarantee(mechanism, rounds=1)
    direct = RDPAccountant()
    direct.history = [(0.9, 0.02, 100)]
    assert adam.epsilon == pytest.approx(direct.get_epsilon(delta=1e-5), rel=1e-9)


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
