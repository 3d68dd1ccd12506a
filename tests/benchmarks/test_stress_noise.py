"""The stress grid's noise-injection arm adds noise of the stated σ, states it, and gives merges the true ΔW noise;
its floor trains the head alone."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from benchmarks.quality.noise_injection import add_factor_noise, dense_noise_std, inject_noise
from hf_dpmerge.data import get_task_spec
from hf_dpmerge.lora import load_saved_adapter
from hf_dpmerge.records.record import PrivacyRecord
from hf_dpmerge.training.lora_classifier import lora_sequence_classifier
from tests.utils.records import privacy_record
from tests.utils.tiny_models import save_tiny_bert

MODULES = ["query", "value", "intermediate.dense"]


def _saved_run(tmp_path, dp: bool = False):
    """<tmp>/runs/rotten_tomatoes/adapter: a tiny-BERT LoRA adapter with trained-looking B and its record."""
    base = save_tiny_bert(tmp_path / "base")
    model = lora_sequence_classifier(base, get_task_spec("rotten_tomatoes"), r=4, alpha=8, target_modules=MODULES)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".lora_B." in name:
                parameter.normal_(0, 0.05)
    run = tmp_path / "runs" / "rotten_tomatoes"
    model.save_pretrained(run / "adapter")
    record = privacy_record("rotten_tomatoes") if dp else privacy_record("rotten_tomatoes", epsilon=math.inf, dp=False)
    record.save(run / "adapter")
    return run


def test_factor_noise_has_the_stated_variance_and_spares_the_head():
    generator = torch.Generator().manual_seed(0)
    tensors = {"x.lora_A.weight": torch.randn(32, 256), "x.lora_B.weight": torch.zeros(256, 32),
               "classifier.modules_to_save.default.weight": torch.randn(2, 32)}
    noisy = add_factor_noise(tensors, 0.03, generator)
    for key in ("x.lora_A.weight", "x.lora_B.weight"):
        difference = noisy[key] - tensors[key]
        assert float(difference.std()) == pytest.approx(0.03, rel=0.03)
        assert abs(float(difference.mean())) < 0.003
    assert torch.equal(noisy["classifier.modules_to_save.default.weight"],
                       tensors["classifier.modules_to_save.default.weight"])
    with pytest.raises(ValueError, match="no LoRA factors"):
        add_factor_noise({"classifier.weight": torch.zeros(2)}, 0.1, generator)


def test_inject_noise_writes_noisy_adapters_and_states_sigma(tmp_path):
    source = _saved_run(tmp_path)
    target = tmp_path / "noisy" / "rotten_tomatoes"
    inject_noise(source, target, 0.02, seed=3)
    clean, noisy = (load_file(d / "adapter" / "adapter_model.safetensors") for d in (source, target))
    lora = [k for k in clean if ".lora_" in k]
    difference = torch.cat([(noisy[k] - clean[k]).flatten() for k in lora])
    assert float(difference.std()) == pytest.approx(0.02, rel=0.1)
    assert all(torch.equal(noisy[k], clean[k]) for k in clean if k not in lora)  # the head is left as trained
    record = PrivacyRecord.load(target / "adapter")
    assert record.extra["injected_noise_std"] == 0.02 and not record.dp  # no DP guarantee is claimed
    encoder = load_file(target / "encoder_adapter" / "adapter_model.safetensors")
    assert set(encoder) == set(lora) and all(torch.equal(encoder[k], noisy[k]) for k in lora)
    again = tmp_path / "again" / "rotten_tomatoes"
    inject_noise(source, again, 0.02, seed=3)
    assert json.loads((again / "adapter" / "dp_privacy.json").read_text()) == record.to_dict()
    assert torch.equal(load_file(again / "adapter" / "adapter_model.safetensors")[lora[0]], noisy[lora[0]])
    with pytest.raises(ValueError, match="DP adapter"):
        inject_noise(_saved_run(tmp_path / "dp", dp=True), tmp_path / "x" / "rotten_tomatoes", 0.02, seed=0)


def test_dense_noise_std_is_the_rms_noise_of_the_delta(tmp_path):
    source = _saved_run(tmp_path)
    sigma = 0.05
    entries = dense_noise_std(source / "adapter", sigma)
    assert entries[-1] == {"filter": None, "value": 0.0}
    factor = next(iter(load_saved_adapter(source / "adapter").factors.values()))
    stated = next(e["value"] for e in entries if e["filter"] == factor.name)
    generator = torch.Generator().manual_seed(1)
    clean = factor.scaling * factor.lora_b.double() @ factor.lora_a.double()
    draws = torch.stack([
        factor.scaling * (factor.lora_b.double() + sigma * torch.randn(factor.lora_b.shape, generator=generator,
                                                                       dtype=torch.float64))
        @ (factor.lora_a.double() + sigma * torch.randn(factor.lora_a.shape, generator=generator, dtype=torch.float64))
        - clean for _ in range(400)])
    assert float(draws.var(dim=0).mean().sqrt()) == pytest.approx(stated, rel=0.05)


def test_head_only_floor_trains_the_head_alone(tmp_path):
    base = save_tiny_bert(tmp_path / "base")
    model = lora_sequence_classifier(base, get_task_spec("bbc_news"), r=4, alpha=8, target_modules=MODULES,
                                     train_lora=False)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("classifier" in n for n in trainable)
    assert any(".lora_B." in n for n, _ in model.named_parameters())  # LoRA is there, frozen at B = 0
