"""What Flower's client-level DP wrappers release, measured against the mechanism our accountant assumes
(docs/design.md §12, "Why not Flower's DP wrappers"): these tests pin the differences that keep
``federated/client_level_dp.py`` our own. If a Flower release changes one of them, its test fails and the
choice is due for review."""

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import NeighboringRelation, PrivacyConfig, RdpAccountant, SamplingMethod
from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg
from flwr.supercore.task_identity import TaskIdentity

from hf_dpmerge.federated.client_level_dp import private_mean_update, sample_clients

K, Q, Z, S, DIM = 4, 0.5, 1.0, 1.0, 20_000  # 4 clients sampled at q = 0.5: q·K = 2 expected per round


class FourNodes:
    """The part of a Flower Grid the strategies read when they sample."""

    def get_node_ids(self) -> list[int]:
        return list(range(1, K + 1))


@pytest.fixture
def flower_task(monkeypatch):
    """Messages need the run identity a ServerApp process sets; give them one outside a run."""
    for name, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, name, value)


def update(client: int) -> torch.Tensor:
    """Client ``client``'s update: 5 along its own axis, so clipping to S leaves S·e_client."""
    u = torch.zeros(DIM)
    u[client] = 5.0
    return u


def flower_release(replying: int) -> np.ndarray:
    """One round of DifferentialPrivacyServerSideFixedClipping over FedAvg, configured for q·K = 2 sampled
    clients, when ``replying`` of the 4 configured clients reply (as Poisson sampling would give)."""
    wrapper = DifferentialPrivacyServerSideFixedClipping(
        FedAvg(fraction_train=1.0, fraction_evaluate=0.0), noise_multiplier=Z, clipping_norm=S,
        num_sampled_clients=round(Q * K),
    )
    instructions = list(wrapper.configure_train(1, ArrayRecord({"w": torch.zeros(DIM)}), ConfigRecord(), FourNodes()))
    replies = [
        Message(RecordDict({"arrays": ArrayRecord({"w": update(k)}), "metrics": MetricRecord({"num-examples": 1})}),
                reply_to=instructions[k])
        for k in range(replying)
    ]
    np.random.seed(0)  # Flower draws its noise from NumPy's global generator
    arrays, _ = wrapper.aggregate_train(1, replies)
    return arrays.to_numpy_ndarrays()[0]


@pytest.mark.parametrize("replying", [1, 3])
def test_flower_noise_is_fixed_on_the_mean_of_the_replies_so_the_sums_noise_multiplier_is_z_m_over_n(
        flower_task, replying):
    clipped_sum = sum(S * update(k) / update(k).norm() for k in range(replying))
    flower = flower_release(replying)
    flower_noise = flower - (clipped_sum / replying).numpy()  # FedAvg: the mean over the m replies
    # Flower: std z·S/n whatever m, on Σ/m; on the sum's scale the noise multiplier is z·m/n, not z
    assert flower_noise.std() == pytest.approx(Z * S / (Q * K), rel=0.03)
    assert flower_noise.std() * replying / S == pytest.approx(Z * replying / (Q * K), rel=0.03)

    ours = private_mean_update([{"w": update(k)} for k in range(replying)], {"w": torch.zeros(DIM)}, clip_norm=S,
                               noise_multiplier=Z, expected_clients=Q * K,
                               generator=torch.Generator().manual_seed(0))["w"]
    ours_noise = ours - clipped_sum / (Q * K)  # the fixed denominator q·K
    assert ours_noise.std().item() * Q * K / S == pytest.approx(Z, rel=0.03)  # multiplier z for every m


def test_flower_releases_nothing_when_no_client_replies(flower_task):
    wrapper = DifferentialPrivacyServerSideFixedClipping(
        FedAvg(fraction_train=1.0, fraction_evaluate=0.0), noise_multiplier=Z, clipping_norm=S, num_sampled_clients=2,
    )
    wrapper.configure_train(1, ArrayRecord({"w": torch.zeros(DIM)}), ConfigRecord(), FourNodes())
    assert wrapper.aggregate_train(1, []) == (None, None)  # the model stays put: "nobody was sampled" is public
    noise_only = private_mean_update([], {"w": torch.zeros(DIM)}, clip_norm=S, noise_multiplier=Z,
                                     expected_clients=Q * K, generator=torch.Generator().manual_seed(0))["w"]
    assert noise_only.std().item() == pytest.approx(Z * S / (Q * K), rel=0.03)  # ours: a noise-only round


def test_flower_samples_a_fixed_number_of_clients_and_accounts_fixed_clipping_without_amplification(flower_task):
    fedavg = FedAvg(fraction_train=Q, fraction_evaluate=0.0)
    counts = {len(list(fedavg.configure_train(r, ArrayRecord({"w": torch.zeros(1)}), ConfigRecord(), FourNodes())))
              for r in range(50)}
    assert counts == {2}  # always ⌊q·K⌋ without replacement: not the Poisson draw the accountant assumes
    generator = torch.Generator().manual_seed(0)
    assert len({len(sample_clients(list(range(K)), Q, generator)) for _ in range(50)}) > 2  # ours: Binomial(K, q)

    poisson = PrivacyConfig(target_delta=1 / (100 * K), population_size=K,
                            neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                            sampling_method=SamplingMethod.POISSON)
    with pytest.raises(ValueError, match="no-amplification"):
        DifferentialPrivacyServerSideFixedClipping(fedavg, noise_multiplier=Z, clipping_norm=S,
                                                   num_sampled_clients=2, accountant=RdpAccountant(poisson))
    with pytest.raises(ValueError, match="Unsupported privacy accounting model"):  # no Poisson replace-one either
        PrivacyConfig(target_delta=1 / (100 * K), population_size=K,
                      neighboring_relation=NeighboringRelation.REPLACE_ONE, sampling_method=SamplingMethod.POISSON)
