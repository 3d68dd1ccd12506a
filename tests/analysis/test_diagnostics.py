"""Geometry diagnostics: sharpness, top Hessian eigenvalue, drift, interpolation / merge gap, the CLI."""

import argparse
import copy
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hf_dpmerge.analysis.batching import Batch, length_sorted_batches
from hf_dpmerge.analysis.diagnostics import CHART_NAME, PRIVACY_NOTE, RESULTS_NAME, diagnose_runs
from hf_dpmerge.analysis.drift import adapter_drift
from hf_dpmerge.analysis.interpolation import interpolation_curve, interpolation_gammas
from hf_dpmerge.analysis.sharpness import hessian_top_eigenvalue, sharpness
from hf_dpmerge.analysis.task_loss import evaluate_loss
from hf_dpmerge.analysis.task_models import load_individual_model, load_merged_with_head
from hf_dpmerge.analysis.task_run import load_split, task_runs
from hf_dpmerge.cli import diagnose_command
from tests.utils.runs_builders import MAX_LENGTH
from tests.utils.tiny_models import tiny_tokenizer
from tests.utils.training_helpers import lora_classifier, text_dataset


def _trained_like(seed: int = 0, **lora):
    """A tiny LoRA classifier with non-zero B (as after training), in eval mode."""
    model = lora_classifier(seed=seed, **lora).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
    return model


def _trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


def _dataset(rows: int = 24):
    return text_dataset(copies=3).select(range(rows)).remove_columns(["text"]).rename_column("label", "labels")


def test_sharpness_matches_a_direct_ascent_step():
    model = _trained_like()
    data = _dataset()
    batches = length_sorted_batches(data, tiny_tokenizer(), batch_size=5)  # several unequal batches
    params = _trainable(model)
    before = [p.detach().clone() for p in params]
    result = sharpness(model, params, batches, rho=0.1)
    assert all(torch.equal(p, b) for p, b in zip(params, before))  # weights restored exactly

    full = length_sorted_batches(data, tiny_tokenizer(), batch_size=len(data))[0]
    loss = torch.nn.functional.cross_entropy(model(**full.inputs).logits, full.labels)
    grads = torch.autograd.grad(loss, params)
    loss = loss.detach()
    norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
    with torch.no_grad():
        for p, g in zip(params, grads):
            p.add_(0.1 * g / norm)
        ascended = torch.nn.functional.cross_entropy(model(**full.inputs).logits, full.labels)
    assert result.loss == pytest.approx(float(loss), rel=1e-5)
    assert result.gradient_norm == pytest.approx(float(norm), rel=1e-4)
    assert result.perturbed_loss == pytest.approx(float(ascended), rel=1e-5)
    assert result.value == pytest.approx(float(ascended - loss), abs=1e-6) and result.value > 0


def test_hessian_top_eigenvalue_matches_the_dense_hessian():
    model = _trained_like(r=1, target_modules=["query"]).double()
    for name, param in model.named_parameters():  # the LoRA factors alone: a dense Hessian small enough to build
        param.requires_grad_("lora_" in name)
    data = _dataset(12)
    batches = length_sorted_batches(data, tiny_tokenizer(), batch_size=5)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = _trainable(model)
    shapes, sizes = [p.shape for p in params], [p.numel() for p in params]
    full = length_sorted_batches(data, tiny_tokenizer(), batch_size=len(data))[0]

    def loss_of(flat):
        weights = {n: t.view(s) for n, t, s in zip(names, flat.split(sizes), shapes)}
        logits = torch.func.functional_call(model, weights, args=(), kwargs=full.inputs, strict=False).logits
        return torch.nn.functional.cross_entropy(logits, full.labels)

    flat = torch.cat([p.detach().reshape(-1) for p in params])
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        dense = torch.autograd.functional.hessian(loss_of, flat, vectorize=True)
    exact = float(torch.linalg.eigvalsh((dense + dense.T) / 2).max())
    estimate = hessian_top_eigenvalue(model, params, batches, max_iterations=200, tolerance=1e-10)
    assert estimate.value == pytest.approx(exact, rel=1e-4)
    assert estimate.iterations > 1


class _Saddle(torch.nn.Module):
    """Regression output a·b + c², target 1: at 0 the loss Hessian has eigenvalues −4, −2, 2 (dominant < 0)."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (torch.nn.Parameter(torch.zeros(1, dtype=torch.float64)) for _ in range(3))

    def forward(self, input_ids):
        return SimpleNamespace(logits=(self.a * self.b + self.c**2).expand(len(input_ids), 1))


def test_top_eigenvalue_is_the_largest_not_the_largest_in_magnitude():
    model = _Saddle()
    batch = Batch(np.arange(3), {"input_ids": torch.zeros(3, 1, dtype=torch.long)}, torch.ones(3, dtype=torch.float64))
    estimate = hessian_top_eigenvalue(model, list(model.parameters()), [batch], max_iterations=200, tolerance=1e-10)
    assert estimate.value == pytest.approx(2.0, rel=1e-6)


def test_drift_matches_materialised_weights():
    model = _trained_like(seed=3)
    base = {n: p.detach().clone() for n, p in copy.deepcopy(model).unload().named_parameters()}
    drift = adapter_drift(model)
    merged = dict(copy.deepcopy(model).merge_and_unload().named_parameters())
    assert len(drift.layers) == 4  # 2 layers × (query, value)
    deltas, bases = [], []
    for layer in drift.layers:
        name = f"{layer.name}.weight"
        delta = torch.linalg.matrix_norm(merged[name].detach() - base[name])
        assert layer.delta_norm == pytest.approx(float(delta), rel=1e-4)
        assert layer.ratio == pytest.approx(float(delta / torch.linalg.matrix_norm(base[name])), rel=1e-4)
        deltas.append(float(delta) ** 2)
        bases.append(float(torch.linalg.matrix_norm(base[name])) ** 2)
    assert drift.total == pytest.approx(math.sqrt(sum(deltas) / sum(bases)), rel=1e-4) and drift.total > 0
    assert all(layer.name.startswith("bert.encoder.layer.") for layer in drift.layers)


def test_interpolation_ends_are_the_task_and_merged_models(fake_runs):
    run = task_runs(fake_runs["runs"], ["election_tweets"])[0]
    data = load_split(run, "validation", tiny_tokenizer(), max_samples=30)
    batches = length_sorted_batches(data, tiny_tokenizer(), batch_size=8)
    task_model = load_individual_model(fake_runs["base"], run.adapter_dir, run.spec)
    merged = load_merged_with_head(fake_runs["merged"], run.adapter_dir, run.spec)
    before = {k: v.clone() for k, v in task_model.state_dict().items()}
    curve = interpolation_curve(task_model, merged, batches, run.spec, gammas=[0.5])
    assert curve.gammas == [0.0, 0.5, 1.0]
    assert all(torch.equal(v, before[k]) for k, v in task_model.state_dict().items())  # w_t restored
    own = evaluate_loss(load_individual_model(fake_runs["base"], run.adapter_dir, run.spec), batches).loss
    other = evaluate_loss(merged, batches).loss
    assert curve.losses[0] == pytest.approx(own, abs=1e-6)
    assert curve.losses[-1] == pytest.approx(other, abs=1e-6)
    assert curve.merge_gap == pytest.approx(other - own, abs=1e-6) and abs(curve.merge_gap) > 1e-4
    assert all(0.0 <= score <= 1.0 for score in curve.scores) and curve.metric == "accuracy"


def test_gammas_are_checked_and_completed():
    assert interpolation_gammas([0.3, 0.3, 0.7]) == [0.0, 0.3, 0.7, 1.0]
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        interpolation_gammas([1.5])


def test_cli_writes_diagnostics_plot_and_privacy_note(fake_runs, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    diagnose_command.add_arguments(parser)
    out = tmp_path / "diag"
    args = parser.parse_args(["--runs", str(fake_runs["runs"]), "--merged", str(fake_runs["merged"]),
                              "--max-samples", "20", "--gammas", "0.25,0.75", "--hessian-iterations", "3",
                              "--output-dir", str(out), "--max_length", str(MAX_LENGTH)])
    assert diagnose_command.run(args) == 0
    data = json.loads((out / RESULTS_NAME).read_text())
    assert set(data["tasks"]) == {"bbc_news", "election_tweets"}
    bbc = data["tasks"]["bbc_news"]
    assert bbc["num_examples"] == 20 and bbc["split"] == "validation" and bbc["epsilon"] == 4.0
    assert bbc["merge_gap"] == pytest.approx(0.0, abs=1e-5)  # the merged encoder is bbc's own
    assert bbc["interpolation"]["gamma"] == [0.0, 0.25, 0.75, 1.0]
    assert bbc["hessian_detail"]["iterations"] <= 3 and bbc["sharpness"] is not None and bbc["drift"] > 0
    assert set(bbc["drift_detail"]["layers"]) == {f"bert.encoder.layer.{i}.attention.self.{m}"
                                                  for i in (0, 1) for m in ("query", "value")}
    assert data["privacy_note"] == PRIVACY_NOTE
    assert (out / CHART_NAME).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "NOT covered" in printed and "election_tweets" in printed


def test_geometry_only_and_bad_requests(fake_runs):
    report = diagnose_runs(fake_runs["runs"], None, ["bbc"], max_samples=10, hessian_iterations=0,
                           max_length=MAX_LENGTH, log=lambda line: None)
    row = report.tasks[0]
    assert row.interpolation is None and row.hessian is None and row.sharpness is not None
    assert report.to_dict()["tasks"]["bbc_news"]["merge_gap"] is None
    with pytest.raises(ValueError, match="nothing to diagnose"):
        diagnose_runs(fake_runs["runs"], None, geometry=False)
    with pytest.raises(FileNotFoundError, match="mergekit-yaml"):
        diagnose_runs(fake_runs["runs"], fake_runs["runs"] / "nowhere")
