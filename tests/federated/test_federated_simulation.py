"""``hf-dpmerge federated`` end to end on a tiny model: 4 clients, 2 rounds, in Flower's simulation engine."""

import json
from pathlib import Path

import pytest
from opacus.accountants import RDPAccountant
from safetensors.torch import load_file

from hf_dpmerge import PrivacyRecord
from hf_dpmerge.cli.main import main as hf_dpmerge
from hf_dpmerge.training.dp.accounting import replace_one_epsilon
from tests.utils.tiny_models import save_tiny_bert

TINY = ["--max_train_samples", "128", "--max_eval_samples", "32", "--num_clients", "4", "--rounds", "2",
        "--local_steps", "2", "--batch_size", "8", "--physical_batch_size", "8", "--lora_r", "2",
        "--accountant", "rdp", "--dp_seed", "0"]


def federated(tmp_path: Path, *flags: str) -> dict:
    """``hf-dpmerge federated`` in this process (its clients still run in Flower's Ray workers)."""
    base = save_tiny_bert(tmp_path / "base")
    assert hf_dpmerge(["federated", "--model_name_or_path", str(base), *TINY, "--output_dir",
                       str(tmp_path / "fed"), *flags]) == 0
    return json.loads((tmp_path / "fed" / "federated_privacy.json").read_text())


@pytest.mark.slow
def test_fedavg_simulation_trains_the_global_adapter_and_writes_both_records(tmp_path):
    summary = federated(tmp_path)
    weights = load_file(tmp_path / "fed" / "adapter" / "adapter_model.safetensors")
    lora_b = [t for name, t in weights.items() if "lora_B" in name]
    assert lora_b and all(t.abs().sum() > 0 for t in lora_b)  # LoRA B starts at 0: the global state moved

    clients = summary["guarantee"]["example_level"]["clients"]
    assert [c["client"] for c in clients] == [0, 1, 2, 3] and all(c["steps"] == 4 for c in clients)
    assert [h["sampled_clients"] for h in summary["history"]] == [[], [0, 1, 2, 3], [0, 1, 2, 3]]
    record = PrivacyRecord.load(tmp_path / "fed" / "adapter")
    assert record.epsilon == summary["guarantee"]["example_level"]["epsilon"] <= 8.0 + 1e-6
    assert record.steps == 4 and record.extra["federated"]["client_level"] is None
    assert record.epsilon_replace_one == pytest.approx(replace_one_epsilon(
        effective_noise_multiplier=record.effective_noise_multiplier, sample_rate=record.sample_rate, steps=4,
        delta=record.delta))  # all 4 steps of the client, not one round's
    assert "clients" not in record.extra["federated"]["example_level"]
    assert PrivacyRecord.load(tmp_path / "fed" / "encoder_adapter").epsilon == record.epsilon
    metrics = json.loads((tmp_path / "fed" / "eval_metrics.json").read_text())
    assert 0.0 <= metrics["test"]["accuracy"] <= 1.0


@pytest.mark.slow
def test_client_level_dp_simulation_reports_the_rounds_accounted_at_z_and_q(tmp_path):
    summary = federated(tmp_path, "--client_noise_multiplier", "2.0", "--client_clip_norm", "0.05",
                        "--client_sample_rate", "0.5", "--aggregation", "dp_aware")
    client_level = summary["guarantee"]["client_level"]
    direct = RDPAccountant()
    direct.history = [(2.0, 0.5, 2)]
    assert client_level["epsilon"] == pytest.approx(direct.get_epsilon(delta=1 / 400), rel=1e-9)  # 1/(100·K)
    assert client_level["epsilon_replace_one"] == pytest.approx(replace_one_epsilon(
        effective_noise_multiplier=2.0, sample_rate=0.5, steps=2, delta=1 / 400))
    assert client_level["neighbouring_relation"] == "add/remove-one" and not client_level["allow_large_delta"]
    trained = {c["client"]: c["rounds_trained"] for c in summary["guarantee"]["example_level"]["clients"]}
    sampled = [c for h in summary["history"] for c in h["sampled_clients"]]
    assert trained == {c: sampled.count(c) for c in set(sampled)}  # each client accounted for its own rounds
    record = PrivacyRecord.load(tmp_path / "fed" / "adapter")
    assert record.extra["federated"]["client_level"] == client_level
    card = (tmp_path / "fed" / "adapter" / "README.md").read_text()
    assert f"ε = {client_level['epsilon']:.3g} at δ = 0.0025 over 2 rounds" in card
    # released: no participation; each client's example-level ε as if sampled in all 2 rounds (4 steps ≤ ε 8)
    assert record.steps == 4  # every round counted, whatever the draw
    released = json.dumps(record.to_dict())
    assert "sampled_clients" not in released and "rounds_trained" not in released
    worst = summary["guarantee"]["example_level"]["clients"][0]
    direct = RDPAccountant()
    direct.history = [(worst["noise_multiplier"], worst["sample_rate"], 4)]
    assert record.epsilon == pytest.approx(direct.get_epsilon(delta=worst["delta"]), rel=1e-9)


@pytest.mark.slow
def test_fedprox_simulation_sends_mu_to_every_client_and_aggregates_by_dare(tmp_path):
    """The server refuses a reply whose record lacks the round's μ, so finishing means every client applied it."""
    summary = federated(tmp_path, "--server_strategy", "fedprox", "--proximal_mu", "0.5", "--aggregation", "dare",
                        "--dare_density", "0.5", "--server_learning_rate", "0.5")
    assert summary["server"]["server_strategy"] == "fedprox" and summary["server"]["proximal_mu"] == 0.5
    assert summary["server"]["aggregation"] == "dare"
    weights = load_file(tmp_path / "fed" / "adapter" / "adapter_model.safetensors")
    assert all(t.abs().sum() > 0 for name, t in weights.items() if "lora_B" in name)
