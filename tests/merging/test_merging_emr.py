"""EMR-Merging (arXiv 2405.17461): the elected root, each task's mask and rescaler, and the task models that
``hf-dpmerge merge``, ``evaluate``, ``push`` and stock transformers build from them, against the paper's formulas
worked by hand and by brute force."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hf_dpmerge.analysis.emr_modulation import load_modulated_with_head, run_modulator, unified_delta
from hf_dpmerge.cli.main import main
from hf_dpmerge.lora import load_saved_adapter
from hf_dpmerge.merging.methods.emr import emr_elect
from hf_dpmerge.modeling.modeling_mean_pooling_bert import MODULATOR_SCALE, modulated, pack_mask, unpack_mask
from hf_dpmerge.modeling.task_modulator import modulator_tensors, task_modulator
from tests.utils.merging_builders import lora_config_yaml

TASKS = {"rotten_tomatoes": 2, "election_tweets": 3, "bbc_news": 5}


# By hand: τ1 = (2, −1, 0.5, 1), τ2 = (−1, −3, 1, −1): Σ = (1, −4, 1.5, 0), so γ = (+, −, +, 0);
# ε = (2 [τ1 agrees], 3 [both agree: max], 1 [both: max], 0 [γ = 0: none agrees]); τ_uni = (2, −3, 1, 0).
# M1 = (1, 1, 1, 0), λ1 = (2 + 1 + 0.5 + 1) / (2 + 3 + 1) = 0.75; M2 = (0, 1, 1, 0), λ2 = (1 + 3 + 1 + 1) / 4 = 1.5.
def test_the_election_masks_and_rescalers_worked_by_hand() -> None:
    tau1, tau2 = torch.tensor([2.0, -1.0, 0.5, 1.0]), torch.tensor([-1.0, -3.0, 1.0, -1.0])
    unified = emr_elect([tau1, tau2])
    assert unified.tolist() == [2.0, -3.0, 1.0, 0.0]
    masks1, scale1 = task_modulator({"w": tau1}, {"w": unified})
    masks2, scale2 = task_modulator({"w": tau2}, {"w": unified})
    assert masks1["w"].tolist() == [True, True, True, False] and scale1 == pytest.approx(0.75)
    assert masks2["w"].tolist() == [False, True, True, False] and scale2 == pytest.approx(1.5)
    root = torch.tensor([10.0, 10.0, 10.0, 10.0]) + unified  # W_0 = 10
    task2 = modulated({"w": root}, {"w": unified}, modulator_tensors(masks2, scale2))["w"]
    assert task2.tolist() == pytest.approx([10.0, 10.0 - 4.5, 11.5, 10.0])  # W_0 + λ2·M2 ⊙ τ_uni


def test_the_election_is_the_papers_definition_entry_by_entry_and_masks_pack_exactly() -> None:
    generator = torch.Generator().manual_seed(0)
    taus = [torch.randn(5, 7, generator=generator) * (torch.rand(5, 7, generator=generator) > 0.3) for _ in range(4)]
    unified = emr_elect(taus)
    for index in range(35):
        values = [float(t.flatten()[index]) for t in taus]
        sign = (sum(values) > 0) - (sum(values) < 0)
        agreeing = [abs(v) for v in values if v * sign > 0]
        assert float(unified.flatten()[index]) == pytest.approx(sign * max(agreeing, default=0.0))
    for tau in taus:
        masks, scale = task_modulator({"w": tau, "untouched": torch.zeros(3)}, {"w": unified})
        assert torch.equal(masks["w"], tau * unified > 0)
        assert scale == pytest.approx(float(tau.abs().sum() / (unified * masks["w"]).abs().sum()))
        assert torch.equal(unpack_mask(pack_mask(masks["w"]), masks["w"].shape), masks["w"])
    masks, _ = task_modulator({}, {"w": unified})  # a task that changed nothing keeps W_0
    state = modulated({"w": unified + 1.0}, {"w": unified}, modulator_tensors(masks, 0.0))
    torch.testing.assert_close(state["w"], torch.ones(5, 7))


def merged_in(root: Path, tasks: list[str], out: str) -> Path:
    """``hf-dpmerge merge`` with ``emr`` of ``root``/runs' ``tasks``, run in ``root``."""
    (root / f"{out}.yaml").write_text(lora_config_yaml("emr", "./runs/base",
                                                       [f"./runs/{task}/encoder_adapter" for task in tasks]))
    before = Path.cwd()
    os.chdir(root)
    try:
        assert main(["merge", f"{out}.yaml", out, "--lora-merge-cache", "runs/lora_cache", "--quiet"]) == 0
    finally:
        os.chdir(before)
    return root / out


@pytest.fixture(scope="module")
def emr_merge(merge_runs):
    """The tiny runs ([CLS] pooling) merged by ``hf-dpmerge merge`` with ``emr`` into ``merged_emr``."""
    root = merge_runs(TASKS).parent
    merged_in(root, list(TASKS), "merged_emr")
    return root


def exact_task_vectors(runs: Path) -> dict[str, dict[str, torch.Tensor]]:
    vectors = {}
    for task in TASKS:
        factors = load_saved_adapter(runs / task / "encoder_adapter").factors
        vectors[task] = {name: (lambda lr: lr[0].double() @ lr[1].double())(f.delta_factors())
                         for name, f in factors.items()}
    return vectors


@pytest.mark.slow
def test_an_emr_merge_is_the_elected_root_and_every_task_model_is_its_modulated_root(emr_merge, tmp_path) -> None:
    """The root is W_0 + τ_uni of the exact LoRA deltas; evaluate's task model, ``hf-dpmerge merge``'s task folder
    and the pushed release loaded by stock transformers (hf_dpmerge blocked) all equal W_0 + λ_t·M_t ⊙ τ_uni."""
    from hf_dpmerge.data import get_task_spec
    from tests.utils.stock_loading import TEXTS, load_without_hf_dpmerge
    from tests.utils.tiny_models import tiny_tokenizer

    runs, merged = emr_merge / "runs", emr_merge / "merged_emr"
    base, weights = load_file(runs / "base" / "model.safetensors"), load_file(merged / "model.safetensors")
    vectors = exact_task_vectors(runs)
    names = sorted(next(iter(vectors.values())))
    for name in names:
        elected = emr_elect([vectors[t][name] for t in TASKS])
        torch.testing.assert_close(weights[name].double(), base[name].double() + elected, atol=1e-6, rtol=0)
    assert sorted(unified_delta(runs / "base", merged)) == names  # the query/value weights, nothing else
    unified = {name: emr_elect([vectors[t][name] for t in TASKS]) for name in names}
    task = "bbc_news"
    kept = sum(float((unified[n] * (vectors[task][n] * unified[n] > 0)).abs().sum()) for n in names)
    scale = sum(float(vectors[task][n].abs().sum()) for n in names) / kept
    model = load_modulated_with_head(merged, runs / task / "adapter", get_task_spec(task),
                                     unified_delta(runs / "base", merged))
    folder = load_file(merged / task / "model.safetensors")
    for name in names:
        expected = base[name].double() + scale * (vectors[task][name] * unified[name] > 0) * unified[name]
        torch.testing.assert_close(model.state_dict()[name].double(), expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(folder[name].double(), expected, atol=1e-5, rtol=0)
    with torch.no_grad():
        logits = model(**tiny_tokenizer()(TEXTS, padding=True, return_tensors="pt")).logits
    assert main(["push", str(merged), "--runs", str(runs), "--tasks", ",".join(TASKS), "--repo_id", "you/emr",
                 "--dry-run", "--staging_dir", str(tmp_path / "hub")]) == 0
    staged = tmp_path / "hub"  # [CLS] pooling: whole stock task models, modulated
    assert not (staged / "unified_delta.safetensors").exists()
    for path, subfolder in ((staged, task), (merged, task)):
        answer = load_without_hf_dpmerge("auto", path, subfolder, HF_MODULES_CACHE=str(tmp_path / "modules"))
        assert "error" not in answer, answer
        torch.testing.assert_close(torch.tensor(answer["logits"]), logits, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_evaluate_scores_each_task_on_its_modulated_model(emr_merge) -> None:
    """The merged column of an emr merge is the modulated task model: with one task merged, EMR is lossless
    (τ_uni = τ_1, M_1 = [τ_1 ≠ 0], λ_1 = 1), so merged = individual exactly."""
    from hf_dpmerge.analysis.evaluation import evaluate_runs
    from tests.utils.runs_builders import MAX_LENGTH

    root = emr_merge
    (report,) = evaluate_runs(root / "runs", merged_in(root, ["bbc_news"], "merged_one"), ["bbc_news"],
                              max_eval_samples=40,
                              max_length=MAX_LENGTH, log=lambda line: None, progress=False).tasks
    assert report.merged == report.individual and report.merged_metrics == report.individual_metrics




@pytest.mark.slow
def test_a_mean_pooling_release_ships_the_unified_delta_once_and_a_packed_modulator_per_task(emr_merge, tmp_path):
    """Mean pooling: the root holds W_root and δ_uni, each task folder its head, packed masks and λ_t; stock
    transformers (hf_dpmerge blocked) loading a task computes evaluate's modulated task model."""
    from hf_dpmerge.data import get_task_spec
    from hf_dpmerge.modeling.mean_pooling import load_sequence_classifier
    from tests.utils.stock_loading import TEXTS, load_without_hf_dpmerge
    from tests.utils.tiny_models import tiny_tokenizer

    root = tmp_path / "mean"
    shutil.copytree(emr_merge / "runs", root / "runs", ignore=shutil.ignore_patterns("lora_cache", "base"))
    load_sequence_classifier(emr_merge / "runs" / "base", classifier_pooling="mean").save_pretrained(
        root / "runs" / "base")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(emr_merge / "runs" / "base" / name, root / "runs" / "base")
    merged, task = merged_in(root, list(TASKS), "merged"), "bbc_news"
    unified = unified_delta(root / "runs" / "base", merged)
    model = load_modulated_with_head(merged, root / "runs" / task / "adapter", get_task_spec(task), unified)
    with torch.no_grad():
        logits = model(**tiny_tokenizer()(TEXTS, padding=True, return_tensors="pt")).logits
    assert main(["push", str(merged), "--runs", str(root / "runs"), "--tasks", ",".join(TASKS), "--repo_id",
                 "you/emr", "--dry-run", "--staging_dir", str(tmp_path / "hub")]) == 0
    staged = tmp_path / "hub"
    assert sorted(load_file(staged / "unified_delta.safetensors")) == sorted(unified)
    modulator = load_file(staged / task / "task_modulator.safetensors")
    masks, scale = run_modulator(root / "runs" / task / "adapter", unified)
    assert float(modulator[MODULATOR_SCALE]) == pytest.approx(scale)
    assert all(modulator[n].dtype == torch.uint8 and modulator[n].numel() == -(-masks[n].numel() // 8) for n in masks)
    answer = load_without_hf_dpmerge("auto", staged, task, HF_MODULES_CACHE=str(tmp_path / "modules"))
    assert "error" not in answer, answer
    torch.testing.assert_close(torch.tensor(answer["logits"]), logits, atol=1e-5, rtol=0)
