"""Domain weighting: the shipped weighted recipes merge W = W₀ + λ·Σ wᵢ·sᵢBᵢAᵢ with the YAML's weights, and the
generated configs carry merge_configs' parameters."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from mergekit.config import MergeConfiguration
from safetensors.torch import load_file

from hf_dpmerge.cli.main import main
from hf_dpmerge.merging.merge_config import METHOD_PARAMETERS, lora_merge_config, mergekit_config, mergekit_path
from tests.utils.task_vector_builders import delta, lora_modules, random_factors, save_adapter, save_runs_base

REPO = Path(__file__).resolve().parents[2]
TASKS = ("rotten_tomatoes", "election_tweets", "reuters_r8", "bbc_news")
SHIPPED = {"task_arithmetic": "task_arithmetic.yaml", "ties": "ties.yaml", "dp_aware": "dp.yaml",
           "cauchy_poe": "cauchy_poe.yaml"}


@pytest.mark.parametrize("method", sorted(METHOD_PARAMETERS))
def test_generated_parameters_are_the_shipped_configs(method: str) -> None:
    shipped = yaml.safe_load((REPO / "merge_configs" / SHIPPED[method]).read_text())
    assert shipped["merge_method"] == method and shipped["parameters"] == METHOD_PARAMETERS[method]


def test_generated_config_carries_per_model_weights_and_is_refused_when_wrong() -> None:
    config = lora_merge_config("dp_aware", "runs/base", ["runs/a/encoder_adapter", "/abs/b"], weights=[2, 0.5])
    parsed = MergeConfiguration.model_validate(config)
    assert [str(m.model) for m in parsed.models] == ["./runs/base+./runs/a/encoder_adapter", "./runs/base+/abs/b"]
    assert [m.parameters["weight"] for m in parsed.models] == [2.0, 0.5]
    assert mergekit_path("../x") == "../x"
    with pytest.raises(ValueError, match="one weight per adapter"):
        lora_merge_config("ties", "base", ["a", "b"], weights=[1.0])
    with pytest.raises(ValueError, match="--method"):
        lora_merge_config("slerp", "base", ["a", "b"])


def test_one_builder_writes_every_generated_config_full_models_and_per_model_settings_included() -> None:
    """The builder the similarity groups, domain weighting and the benchmarks use: per-model settings where given,
    full-model inputs as they are, and mergekit's own validation."""
    config = mergekit_config("ties", "/b", ["/m1", "/m2"], parameters={"density": 0.2},
                             per_model=[{"weight": 1.0}, None])
    parsed = MergeConfiguration.model_validate(config)
    assert [str(m.model) for m in parsed.models] == ["/m1", "/m2"] and parsed.models[1].parameters is None
    assert parsed.models[0].parameters["weight"] == 1.0 and config["parameters"] == {"density": 0.2}
    with pytest.raises(ValueError, match="give one per model"):
        mergekit_config("ties", "/b", ["/m1", "/m2"], per_model=[{}])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("domain")
    save_runs_base(root / "runs")
    for seed, task in enumerate(TASKS, start=11):
        save_adapter(root / "runs", task, random_factors(seed))
    return root


def _weights(config: dict) -> dict[str, float]:
    return {m["model"].split("/")[-2]: m["parameters"]["weight"] for m in config["models"]}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["domain_weighting.yaml", "domain_weighting_dp.yaml"])
def test_shipped_domain_weights_reach_the_merge(workdir: Path, name: str, monkeypatch) -> None:
    """The recipe runs unchanged on the training layout and each LoRA layer is W₀ + λ·Σ wᵢ·τᵢ (dp_aware's
    denoising is switched off with noise_std 0 so the sum is exact)."""
    config = yaml.safe_load((REPO / "merge_configs" / name).read_text())
    weights = _weights(config)
    assert weights["rotten_tomatoes"] > max(w for task, w in weights.items() if task != "rotten_tomatoes")
    if config["merge_method"] == "dp_aware":
        for model in config["models"]:
            model["parameters"]["noise_std"] = 0.0
    monkeypatch.chdir(workdir)
    (workdir / name).write_text(yaml.safe_dump(config))
    out = workdir / "merged" / name
    assert main(["merge", name, str(out), "--lora-merge-cache", "runs/lora_cache", "--quiet"]) == 0
    merged = load_file(out / "model.safetensors")
    base = load_file(workdir / "runs" / "base" / "model.safetensors")
    lam = config["parameters"]["lambda"]
    for module in lora_modules():
        key = f"bert.encoder.layer.{module}.weight"
        expected = base[key].double() + lam * sum(
            weights[task] * delta(random_factors(seed), module) for seed, task in enumerate(TASKS, start=11))
        torch.testing.assert_close(merged[key].double(), expected, rtol=1e-5, atol=1e-5)
