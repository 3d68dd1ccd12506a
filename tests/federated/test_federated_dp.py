"""Client-level DP at the server, the aggregation kernels on client updates, and both guarantees' accounting."""

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
from opacus.accountants import PRVAccountant, RDPAccountant

from hf_dpmerge.cli.main import main
from hf_dpmerge.federated.aggregation import (
    ClientUpdate,
    merge_updates,
    private_aggregate,
    tensor_noise_variance,
)
from hf_dpmerge.federated.client_level_dp import (
    ClientLevelDP,
    clip_update,
    default_client_delta,
    private_mean_update,
    sample_clients,
)
from hf_dpmerge.federated.federation import FederatedSetup
from hf_dpmerge.federated.guarantee import (
    client_example_level,
    federated_guarantee,
    planned_client_records,
    released_guarantee,
)
from hf_dpmerge.federated.simulation import global_record
from hf_dpmerge.records.record import PrivacyRecord
from tests.utils.independent_accounting import gaussian_epsilon, independent_replace_one_epsilon
from tests.utils.records import privacy_record
from tests.utils.tiny_models import save_tiny_bert

TEMPLATE = {"lora_A": torch.zeros(2, 3), "classifier.modules_to_save.default.weight": torch.zeros(2)}


ROUND = {"noise_multiplier": 0.8, "effective_noise_multiplier": 0.8, "sample_rate": 0.01, "steps": 10,
         "delta": 1e-5, "num_samples": 1000, "num_units": 1000, "accountant": "prv", "optimizer": {"name": "adamw"},
         "sum_lr_squared": 1e-4}


def record(**fields):
    """A client round's privacy record (10 steps at σ 0.8, q 0.01, δ 1e-5, AdamW) with ``fields`` replaced."""
    return dataclasses.replace(privacy_record("t"), **{**ROUND, **fields})


def generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_clipping_scales_the_whole_update_to_norm_s():
    update = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([4.0])}  # ‖u‖ = 5
    clipped = clip_update(update, 1.0)
    assert torch.allclose(clipped["a"], torch.tensor([0.6, 0.0])) and torch.allclose(clipped["b"], torch.tensor([0.8]))
    assert clip_update(update, 10.0)["a"].equal(update["a"])  # inside the ball: untouched


def test_without_noise_the_release_is_the_exact_clipped_sum_over_expected_clients():
    u1 = {"lora_A": torch.full((2, 3), 1.0), "classifier.modules_to_save.default.weight": torch.zeros(2)}  # ‖u1‖ = √6
    u2 = {"lora_A": torch.zeros(2, 3), "classifier.modules_to_save.default.weight": torch.tensor([0.3, 0.4])}  # 0.5
    released = private_mean_update([u1, u2], TEMPLATE, clip_norm=1.0, noise_multiplier=0.0, expected_clients=2.5,
                                   generator=generator())
    # by hand: u1 is scaled by 1/√6, u2 (norm 0.5 ≤ S) is kept; the sum is divided by q·K = 2.5
    assert torch.allclose(released["lora_A"], torch.full((2, 3), 1 / math.sqrt(6) / 2.5))
    assert torch.allclose(released["classifier.modules_to_save.default.weight"], torch.tensor([0.12, 0.16]))


def test_noise_std_is_z_s_over_the_expected_number_of_clients():
    template = {"w": torch.zeros(400, 500)}
    z, s, expected = 1.5, 0.2, 2.5
    released = private_mean_update([], template, clip_norm=s, noise_multiplier=z, expected_clients=expected,
                                   generator=generator(3))
    assert released["w"].std().item() == pytest.approx(z * s / expected, rel=0.01)
    assert abs(released["w"].mean().item()) < 0.01 * z * s / expected
    again = private_mean_update([], template, clip_norm=s, noise_multiplier=z, expected_clients=expected,
                                generator=generator(3))
    assert again["w"].equal(released["w"])  # seeded: reproducible


def test_poisson_client_sampling_has_rate_q():
    rng = generator(1)
    counts = [len(sample_clients(list(range(100)), 0.3, rng)) for _ in range(200)]
    assert sum(counts) / (100 * 200) == pytest.approx(0.3, abs=0.01)
    assert sample_clients([5, 7, 9], 1.0, rng) == [5, 7, 9]
    with pytest.raises(ValueError, match="sample rate"):
        sample_clients([1], 0.0, rng)


@pytest.mark.parametrize("accountant, opacus_accountant", [("rdp", RDPAccountant), ("prv", PRVAccountant)])
def test_client_level_epsilon_is_opacus_accountant_at_z_q_over_rounds(accountant, opacus_accountant):
    mechanism = ClientLevelDP(noise_multiplier=1.1, clip_norm=0.1, sample_rate=0.2, num_clients=100,
                              accountant=accountant)
    reported = federated_guarantee({}, mechanism, rounds=30)["client_level"]
    direct = opacus_accountant()
    for _ in range(30):
        direct.step(noise_multiplier=1.1, sample_rate=0.2)
    assert reported["delta"] == pytest.approx(1 / 10_000)  # default 1/(100·K)
    assert reported["epsilon"] == pytest.approx(direct.get_epsilon(delta=1 / 10_000), rel=1e-6)
    assert reported["neighbouring_relation"] == "add/remove-one" and reported["privacy_unit"].startswith("client")


def test_client_level_replace_one_epsilon_matches_an_independent_accountant():
    # the audited run (z = 2, q = 0.5, 2 rounds, δ = 1/40): RDP add/remove ε 0.719, replace-one ε 1.12
    mechanism = ClientLevelDP(noise_multiplier=2.0, clip_norm=0.05, sample_rate=0.5, num_clients=4,
                              accountant="rdp", target_delta=1 / 40)
    reported = federated_guarantee({}, mechanism, rounds=2)["client_level"]
    assert reported["epsilon"] == pytest.approx(0.719, abs=1e-3)
    independent = independent_replace_one_epsilon(2.0, 0.5, 2, 1 / 40)
    assert reported["epsilon_replace_one"] == pytest.approx(independent, rel=0.01)
    assert reported["epsilon_replace_one"] == pytest.approx(1.12, abs=0.01)


def test_client_level_replace_one_epsilon_without_sampling_is_the_gaussian_at_sensitivity_2s():
    # q = 1: every round is the Gaussian mechanism, sensitivity 2S against noise zS, so R rounds are μ = 2√R/z
    mechanism = ClientLevelDP(noise_multiplier=1.0, clip_norm=0.5, sample_rate=1.0, num_clients=4, accountant="prv")
    reported = federated_guarantee({}, mechanism, rounds=4)["client_level"]
    exact = gaussian_epsilon(2 * math.sqrt(4) / 1.0, 1 / 400)
    assert exact <= reported["epsilon_replace_one"] <= exact + 0.02  # PLD rounds pessimistically
    assert reported["epsilon"] == pytest.approx(gaussian_epsilon(math.sqrt(4) / 1.0, 1 / 400), rel=0.01)


@pytest.mark.parametrize("num_clients", [1, 4, 100, 10_000])
def test_default_client_delta_scales_with_the_number_of_clients(num_clients):
    mechanism = ClientLevelDP(noise_multiplier=1.0, clip_norm=0.1, sample_rate=1.0, num_clients=num_clients)
    assert mechanism.delta == default_client_delta(num_clients) == pytest.approx(0.01 / num_clients)
    assert num_clients * mechanism.delta == pytest.approx(0.01)  # union bound over all clients: 1%


def test_client_level_delta_at_or_above_one_over_k_needs_the_opt_in():
    with pytest.raises(ValueError, match="--allow_large_client_delta"):
        ClientLevelDP(noise_multiplier=1.0, clip_norm=0.1, sample_rate=1.0, num_clients=4, target_delta=0.25)
    weak = ClientLevelDP(noise_multiplier=1.0, clip_norm=0.1, sample_rate=1.0, num_clients=4, target_delta=0.25,
                         allow_large_delta=True)
    stated = federated_guarantee({}, weak, rounds=1)["client_level"]
    assert stated["delta"] == 0.25 and stated["allow_large_delta"] is True
    with pytest.raises(ValueError, match="--client_delta must lie in"):
        ClientLevelDP(noise_multiplier=1.0, clip_norm=0.1, sample_rate=1.0, num_clients=4, target_delta=1.0,
                      allow_large_delta=True)


def test_example_level_composes_all_rounds_in_one_accountant():
    rounds = [record(accountant="rdp") for _ in range(3)]  # 10 steps at σ 0.8, q 0.01 each
    guarantee = client_example_level(2, rounds)
    direct = RDPAccountant()
    direct.history = [(0.8, 0.01, 30)]
    assert guarantee.steps == 30 and guarantee.rounds_trained == 3
    assert guarantee.epsilon == pytest.approx(direct.get_epsilon(delta=1e-5), rel=1e-9)
    one_round = RDPAccountant()
    one_round.history = [(0.8, 0.01, 10)]
    assert guarantee.epsilon < 3 * one_round.get_epsilon(delta=1e-5)  # tighter than summing per-round ε


def test_example_level_refuses_rounds_at_different_noise():
    rounds = [record(), record(effective_noise_multiplier=0.5)]
    with pytest.raises(ValueError, match="effective_noise_multiplier"):
        client_example_level(0, rounds)


def test_global_example_level_guarantee_is_the_maximum_over_disjoint_clients():
    records = {0: [record()], 1: [record(), record()]}
    guarantee = federated_guarantee(records, None, rounds=2)
    per_client = [c["epsilon"] for c in guarantee["example_level"]["clients"]]
    assert per_client[1] > per_client[0] and guarantee["example_level"]["epsilon"] == per_client[1]
    assert guarantee["client_level"] is None


def client_update(client: int, state: dict, **fields) -> ClientUpdate:
    return ClientUpdate(client=client, state=state, num_examples=10, record=record(**fields))


def test_task_arithmetic_on_updates_is_global_plus_lambda_times_mean_update():
    base = {"w": torch.tensor([1.0, 2.0])}
    updates = [client_update(0, {"w": torch.tensor([2.0, 2.0])}), client_update(1, {"w": torch.tensor([1.0, 4.0])})]
    merged = merge_updates(base, updates, method="task_arithmetic", server_learning_rate=0.5)
    assert torch.allclose(merged["w"], torch.tensor([1.25, 2.5]))  # 1 + 0.5·(1+0)/2, 2 + 0.5·(0+2)/2


def test_dp_aware_on_updates_removes_updates_at_the_noise_level_and_keeps_large_ones():
    torch.manual_seed(0)
    base = {"w": torch.zeros(2000)}
    signal = torch.zeros(2000)
    signal[:20] = 1.0
    states = [{"w": signal + 0.01 * torch.randn(2000)} for _ in range(3)]
    # Adam: s² = Σ η² = 1e-4 (s = 0.01), the noise level of the updates above
    updates = [client_update(i, s, optimizer={"name": "adamw"}, sum_lr_squared=1e-4) for i, s in enumerate(states)]
    plain = merge_updates(base, updates, method="task_arithmetic", server_learning_rate=1.0)["w"]
    denoised = merge_updates(base, updates, method="dp_aware", server_learning_rate=1.0)["w"]
    assert (denoised - signal).norm() < 0.5 * (plain - signal).norm()
    assert torch.allclose(denoised[:20], signal[:20], atol=0.05)


def test_head_noise_variance_scales_with_the_head_learning_rate():
    adam = record(optimizer={"name": "adamw", "lr": 1e-3, "head_lr": 1e-2}, sum_lr_squared=1e-4)
    assert tensor_noise_variance(adam, "lora_A") == pytest.approx(1e-4)
    assert tensor_noise_variance(adam, "base_model.classifier.modules_to_save.default.weight") == pytest.approx(1e-2)


def test_private_aggregate_without_noise_is_global_plus_lambda_clipped_sum_over_qk():
    base = {"w": torch.tensor([1.0, 1.0])}
    updates = [client_update(0, {"w": torch.tensor([4.0, 5.0])}), client_update(1, {"w": torch.tensor([1.0, 1.5])})]
    mechanism = ClientLevelDP(noise_multiplier=1e-12, clip_norm=1.0, sample_rate=0.5, num_clients=4)
    new = private_aggregate(base, updates, method="fedavg", server_learning_rate=2.0, client_dp=mechanism,
                            generator=generator())
    # Δ0 = (3, 4) clipped to (0.6, 0.8); Δ1 = (0, 0.5) kept; sum / (q·K = 2), times λ = 2
    assert torch.allclose(new["w"], torch.tensor([1.6, 2.3]), atol=1e-6)


def test_updates_with_other_tensors_are_refused():
    base = {"w": torch.zeros(2)}
    with pytest.raises(ValueError, match="differ from the global state"):
        merge_updates(base, [client_update(0, {"v": torch.zeros(2)})], method="task_arithmetic",
                      server_learning_rate=1.0)


def _setup(**fields) -> FederatedSetup:
    """A federation whose clients train 10 steps a round at σ 0.8, expected batch 10, δ 1e-5 and η² = 1e-5 (as
    ``record``: Σ η² = 1e-4 a round)."""
    return FederatedSetup(**{"task": "rotten_tomatoes", "base": "unused", "num_clients": 4, "rounds": 3,
                             "local_steps": 10, "batch_size": 10, "noise_multiplier": 0.8, "target_delta": 1e-5,
                             "learning_rate": 1e-5**0.5, **fields})


def test_released_guarantee_hides_participation_under_client_level_dp():
    records = {0: [record(accountant="rdp")], 3: [record(accountant="rdp")] * 2}  # client 0 sampled once, 3 twice
    mechanism = ClientLevelDP(noise_multiplier=1.0, clip_norm=0.1, sample_rate=0.5, num_clients=4, accountant="rdp")
    planned = planned_client_records(_setup(), [1000] * 4, records)
    released = released_guarantee(records, mechanism, rounds=3, planned=planned)
    worst_case = RDPAccountant()
    worst_case.history = [(0.8, 0.01, 30)]  # sampled in all 3 rounds of 10 steps, whatever the draw was
    assert released["example_level"]["epsilon"] == pytest.approx(worst_case.get_epsilon(delta=1e-5), rel=1e-9)
    assert "clients" not in released["example_level"] and released["client_level"]["rounds"] == 3
    without_server_dp = released_guarantee(records, None, rounds=3)
    ledger = federated_guarantee(records, None, 3)
    assert without_server_dp["example_level"]["epsilon"] == ledger["example_level"]["epsilon"]


SHARDS = [1000, 1000, 400, 1000]  # client 2's small shard: q = 10/400, the largest ε at a fixed σ


def _round_record(client: int) -> PrivacyRecord:
    """Client ``client``'s record of one round of ``_setup()``: its shard size fixes N, q and δ = 1e-5."""
    return record(accountant="rdp", num_samples=SHARDS[client], num_units=SHARDS[client],
                  sample_rate=10 / SHARDS[client])


@pytest.mark.parametrize("sampled", [{0: 1, 1: 2}, {2: 1, 1: 3}, {0: 3, 1: 3, 2: 3, 3: 3}, {3: 1}],
                         ids=["without_the_worst_client", "with_it_once", "everyone_always", "one_client_once"])
def test_under_client_level_dp_the_released_record_does_not_depend_on_who_was_sampled(sampled):
    """Every released field (ε, δ, σ, q, N, steps, Σ η², both levels) is the worst case over all REGISTERED
    clients sampled in every round, from public configuration: the same whichever clients trained, and whether
    client 2, the one with the largest ε, took part at all."""
    mechanism = ClientLevelDP(noise_multiplier=1.0, clip_norm=0.1, sample_rate=0.5, num_clients=4, accountant="rdp")
    everyone = {client: [_round_record(client)] * 3 for client in range(4)}
    expected = global_record(_setup(), SimpleNamespace(records=everyone), mechanism, SHARDS)
    strategy = SimpleNamespace(records={client: [_round_record(client)] * rounds for client, rounds in sampled.items()})
    released = global_record(_setup(), strategy, mechanism, SHARDS)
    assert released.to_dict() == expected.to_dict()
    worst_case = RDPAccountant()
    worst_case.history = [(0.8, 10 / 400, 30)]  # client 2, in all 3 rounds of 10 steps
    assert released.epsilon == pytest.approx(worst_case.get_epsilon(delta=1e-5), rel=1e-9)
    assert (released.num_samples, released.sample_rate, released.steps) == (400, 10 / 400, 30)
    assert released.sum_lr_squared == pytest.approx(3e-4)


def test_a_client_record_that_disagrees_with_the_public_configuration_is_refused():
    mechanism = ClientLevelDP(noise_multiplier=1.0, clip_norm=0.1, sample_rate=0.5, num_clients=4, accountant="rdp")
    other_sigma = dataclasses.replace(_round_record(1), noise_multiplier=0.9, effective_noise_multiplier=0.9)
    more_steps = dataclasses.replace(_round_record(1), steps=11, sum_lr_squared=1.1e-4)
    for records in ({1: [other_sigma]}, {0: [_round_record(0)], 1: [more_steps]}):
        with pytest.raises(RuntimeError, match="differs from the federation's public configuration"):
            global_record(_setup(), SimpleNamespace(records=records), mechanism, SHARDS)
    # a round cut short (fewer steps at the same rate) still releases the planned record, every round counted
    stopped = dataclasses.replace(_round_record(2), steps=9, sum_lr_squared=9e-5)
    everyone = {client: [_round_record(client)] * 3 for client in range(4)}
    assert (global_record(_setup(), SimpleNamespace(records={2: [stopped], 0: [_round_record(0)]}), mechanism,
                          SHARDS).to_dict()
            == global_record(_setup(), SimpleNamespace(records=everyone), mechanism, SHARDS).to_dict())


@pytest.mark.parametrize("sam_mode, queries", [("dp_sat", 1), ("two_query", 2)])
def test_a_calibrated_client_spends_its_target_epsilon_whatever_queries_its_steps_make(sam_mode, queries):
    """A client's σ is calibrated for the queries a step of its SAM mode makes: two_query privatises two of one
    batch, one step at σ/√2, and the accountant over all its steps at that σ_eff lands on the target (within
    opacus' calibration tolerance, 0.01, from below)."""
    setup = _setup(noise_multiplier=None, target_epsilon=4.0, accountant="rdp", sam_mode=sam_mode)
    accountant = RDPAccountant()
    accountant.history = [(setup.client_noise_multiplier(1000) / math.sqrt(queries), 10 / 1000, 30)]
    assert 4.0 - 0.01 <= accountant.get_epsilon(delta=1e-5) <= 4.0


@pytest.mark.parametrize("server_dp", [False, True], ids=["example_level_only", "client_level_dp"])
@pytest.mark.parametrize("shards", [[1000, 1000, 1000, 100], [2000, 2000, 30]])
def test_the_released_replace_one_epsilon_is_the_largest_over_the_clients(shards, server_dp):
    """σ calibrated per shard puts every client's add/remove ε near the target, so the client with the
    largest one is arbitrary (here a large shard); the small shard's large q gives the largest replace-one ε. The
    record states that maximum, each client's recomputed independently at the released (largest) δ."""
    setup = _setup(num_clients=len(shards), noise_multiplier=None, target_epsilon=4.0, target_delta=None,
                   accountant="rdp")
    sigmas = {n: setup.client_noise_multiplier(n) for n in set(shards)}
    records = {client: [record(accountant="rdp", num_samples=n, num_units=n, sample_rate=10 / n, delta=1 / (10 * n),
                               noise_multiplier=sigmas[n], effective_noise_multiplier=sigmas[n])] * 3
               for client, n in enumerate(shards)}  # every client in all 3 rounds of 10 steps
    mechanism = ClientLevelDP(noise_multiplier=1.0, clip_norm=0.1, sample_rate=0.5, num_clients=len(shards),
                              accountant="rdp") if server_dp else None
    released = global_record(setup, SimpleNamespace(records=records), mechanism, shards)
    delta = 1 / (10 * min(shards))
    truth = {n: independent_replace_one_epsilon(sigmas[n], 10 / n, 30, delta) for n in set(shards)}
    assert released.delta == delta and released.num_samples == max(shards)  # the largest add/remove ε: a large shard
    assert truth[min(shards)] > truth[max(shards)] + 1  # so its replace-one ε is not the largest
    assert released.epsilon_replace_one == pytest.approx(max(truth.values()), abs=0.02)
    assert all(released.epsilon_replace_one >= eps - 0.02 for eps in truth.values())


@pytest.mark.parametrize("flags, message", [
    (["--num_clients", "0"], "--num_clients must be ≥ 1"),
    (["--batch_size", "64"], "fewer than --batch_size 64"),
    (["--client_noise_multiplier", "1", "--client_delta", "0.25"], "--allow_large_client_delta"),
    (["--server_learning_rate", "0.5"], "--aggregation task_arithmetic"),
    (["--aggregation", "ties", "--client_noise_multiplier", "1"], "cannot run under client-level DP"),
    (["--aggregation", "ties", "--ties_density", "0"], "--ties_density must be in (0, 1]"),
    (["--server_strategy", "fedadam", "--aggregation", "ties"], "use it with --aggregation fedavg"),
    (["--server_strategy", "fedprox"], "--proximal_mu must be a finite number > 0"),
    (["--proximal_mu", "0.1"], "pass --server_strategy fedprox"),
    (["--aggregation", "dare", "--dare_density", "0"], "--dare_density must be in (0, 1]"),
], ids=["count", "shard", "client_delta", "fedavg_rate", "ties_private", "ties_density", "fedadam_ties",
        "fedprox_mu", "mu_without_fedprox", "dare_density"])
def test_bad_federated_settings_are_refused_before_any_client_trains(tmp_path, capsys, flags, message):
    base = save_tiny_bert(tmp_path / "base")
    code = main(["federated", "--model_name_or_path", str(base), "--max_train_samples", "128", "--batch_size", "8",
                 "--output_dir", str(tmp_path / "fed"), *flags])
    assert code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "fed").exists()


@pytest.mark.parametrize("flag", ["--dataset_path", "--lora_freeze_a", "--lora_a_seed"])
def test_a_flag_of_training_the_federation_does_not_implement_is_refused_not_ignored(tmp_path, capsys, flag):
    value = {"--dataset_path": "glue", "--lora_freeze_a": "true", "--lora_a_seed": "3"}[flag]
    code = main(["federated", flag, value, "--output_dir", str(tmp_path / "fed")])
    assert code == 2 and f"does not support {flag}" in capsys.readouterr().err
    assert not (tmp_path / "fed").exists()


def test_the_federated_flags_are_the_training_dataclasses_fields(capsys):
    """One source per flag: the client's DP-SGD flags carry DPSAMConfig's help, task and LoRA flags the training
    script's dataclasses; the help shows the defaults the federation runs with."""
    from hf_dpmerge.training.dpsam_config import DPSAMConfig

    with pytest.raises(SystemExit):
        main(["federated", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    sam_help = " ".join(next(f for f in dataclasses.fields(DPSAMConfig) if f.name == "sam_mode").metadata["help"]
                        .split())
    assert f"--sam_mode SAM_MODE, --sam-mode SAM_MODE {sam_help} (default: dp_sat)" in text
    assert "--lora_target_modules" in text and "--learning_rate LEARNING_RATE" in text and "(default: 0.002)" in text
    assert "--dataset_path" not in text and "--lora_freeze_a" not in text  # refused, so not offered


def test_ties_aggregation_is_trim_elect_and_disjoint_mean_of_the_client_updates():
    """θ_g + λ·TIES(Δ_k), checked by hand on three clients: each update keeps its largest half, the elected sign
    of a coordinate is that of the trimmed sum, and the kept entries with that sign are averaged."""
    from hf_dpmerge.federated.aggregation import ClientUpdate, merge_updates, ties_update

    deltas = [torch.tensor([0.4, -0.1, 0.3, -0.05]), torch.tensor([-0.2, 0.05, 0.6, -0.3]),
              torch.tensor([0.1, -0.4, -0.2, 0.01])]
    # trimmed to 2 of 4: [0.4, 0, 0.3, 0], [0, 0, 0.6, -0.3], [0, -0.4, -0.2, 0]; sums 0.4, -0.4, 0.7, -0.3
    expected = torch.tensor([0.4, -0.4, (0.3 + 0.6) / 2, -0.3])
    torch.testing.assert_close(ties_update(deltas, 0.5), expected)
    base = {"w": torch.ones(4)}
    updates = [ClientUpdate(client=k, state={"w": base["w"] + d}, num_examples=10, record=None)
               for k, d in enumerate(deltas)]
    merged = merge_updates(base, updates, method="ties", server_learning_rate=0.5, density=0.5)
    torch.testing.assert_close(merged["w"], base["w"] + 0.5 * expected)
