"""The linear probe of ``hf-dpmerge probe``: a fresh logistic regression on pooled features, base vs merged."""

import json

import pytest
import torch

from hf_dpmerge.analysis.probe import fit_probe, probe_accuracy, probe_runs
from hf_dpmerge.cli.main import main
from tests.utils.runs_builders import MAX_LENGTH


def _blobs(n: int, separation: float, seed: int):
    """Two Gaussian classes in 6 dimensions whose means are ``separation`` apart along the first axis."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 2
    features = torch.randn(n, 6, generator=generator)
    features[:, 0] += separation * labels
    return features, labels


def test_probe_reads_a_separable_task_and_not_a_random_one():
    fit, held_out = _blobs(200, 8.0, 0), _blobs(200, 8.0, 1)
    assert probe_accuracy(fit, held_out, 2) == 1.0
    noise_fit, noise_held_out = _blobs(200, 0.0, 2), _blobs(400, 0.0, 3)
    assert abs(probe_accuracy(noise_fit, noise_held_out, 2) - 0.5) < 0.1


def test_probe_is_the_minimiser_of_its_penalised_cross_entropy():
    """At the returned (W, b) the gradient of CE + l2·‖W‖² on the standardised features vanishes."""
    features, labels = _blobs(120, 1.0, 4)
    weight, bias, mean, std = fit_probe(features, labels, 2, l2=1e-2)
    weight.requires_grad_(True), bias.requires_grad_(True)
    z = (features.double() - mean) / std
    loss = torch.nn.functional.cross_entropy(z @ weight.T + bias, labels) + 1e-2 * weight.pow(2).sum()
    gradients = torch.autograd.grad(loss, [weight, bias])
    assert max(g.abs().max() for g in gradients) < 1e-5


def test_the_base_as_the_merged_encoder_probes_the_same_and_the_cli_writes_json(fake_runs, tmp_path, capsys):
    results = probe_runs(fake_runs["runs"], fake_runs["base"], ["bbc", "election_tweets"], max_samples=40,
                         max_length=MAX_LENGTH, log=lambda line: None)
    assert [r.task for r in results] == ["bbc_news", "election_tweets"]
    assert all(r.base == r.merged and r.num_fit == 20 and r.num_held_out == 20 for r in results)
    out = tmp_path / "probe.json"
    assert main(["probe", "--runs", str(fake_runs["runs"]), "--merged", str(fake_runs["merged"]), "--tasks", "bbc",
                 "--max_samples", "40", "--max_length", str(MAX_LENGTH), "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved[0]["task"] == "bbc_news" and saved[0]["change"] == pytest.approx(saved[0]["merged"] - saved[0]["base"])
    assert "base probe" in capsys.readouterr().out


def test_bad_probe_inputs_are_refused_by_name(fake_runs, capsys):
    common = ["probe", "--runs", str(fake_runs["runs"]), "--merged", str(fake_runs["merged"]), "--tasks", "bbc",
              "--max_length", str(MAX_LENGTH)]
    assert main([*common, "--l2", "-1"]) == 2 and "--l2 must be ≥ 0" in capsys.readouterr().err
    assert main([*common, "--max_samples", "3"]) == 2 and "too few to fit and hold out" in capsys.readouterr().err
