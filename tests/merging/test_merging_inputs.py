"""Merge inputs: records found beside adapters, per-model overrides, encoder export, and input checks."""

from __future__ import annotations

import json
from pathlib import Path

import peft
import pytest
import torch
import yaml
from mergekit.common import ModelReference
from mergekit.config import MergeConfiguration
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSequenceClassification

from hf_dpmerge.merging.inputs import RECORD_OVERRIDES, adapter_weights, input_noise_variance, input_record
from hf_dpmerge.merging.privacy_section import privacy_section
from hf_dpmerge.merging.validation import check_inputs, check_parameter_keys
from hf_dpmerge.noise.variance import lora_noise_variance, stats_noise_variance
from hf_dpmerge.records.noise_record import NOISE_STATS_NAME, NoiseStats
from hf_dpmerge.records.record import PRIVACY_RECORD_NAME, PrivacyRecord, PrivacyRecordError
from hf_dpmerge.training.encoder_adapter import export_encoder_adapter
from tests.utils.merging_builders import lora_config_yaml, save_variant

QUERY = "bert.encoder.layer.0.attention.self.query.weight"


@pytest.fixture(scope="module")
def runs(merge_runs) -> Path:
    root = merge_runs({"sentiment": 2, "topics": 4})
    save_variant(root / "base", root / "full", seed=3)
    return root


def _ref(runs: Path, task: str = "sentiment") -> ModelReference:
    return ModelReference.parse(f"{runs / 'base'}+{runs / task / 'encoder_adapter'}")


def _config(runs: Path, adapters: list[Path], **extra: object) -> MergeConfiguration:
    text = lora_config_yaml("dp_aware", str(runs / "base"), [str(a) for a in adapters])
    data = yaml.safe_load(text) | extra
    return MergeConfiguration.model_validate(data)


def _no_noise_needed(_settings: object) -> bool:
    return False


def test_encoder_export_drops_the_head_and_loads_on_a_base_with_another_head(runs: Path) -> None:
    adapter, exported = runs / "topics" / "adapter", runs / "topics" / "encoder_adapter"
    assert any("classifier" in key for key in load_file(adapter / "adapter_model.safetensors"))
    keys = load_file(exported / "adapter_model.safetensors")
    assert keys and all(".lora_A." in key or ".lora_B." in key for key in keys)
    config = json.loads((exported / "adapter_config.json").read_text())
    assert config["modules_to_save"] is None and config["task_type"] is None
    assert PrivacyRecord.load(exported) == PrivacyRecord.load(adapter)
    base = AutoModelForSequenceClassification.from_pretrained(runs / "base")  # 2 labels, adapter's head has 4
    merged = peft.PeftModel.from_pretrained(base, exported).merge_and_unload()
    fresh = AutoModelForSequenceClassification.from_pretrained(runs / "base").state_dict()
    changed = {name for name, value in merged.state_dict().items() if not torch.equal(value, fresh[name])}
    assert changed and all(".query." in name or ".value." in name for name in changed)


def test_encoder_export_is_atomic(runs: Path, tmp_path: Path) -> None:
    broken = tmp_path / "adapter"
    broken.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (broken / name).write_bytes((runs / "topics" / "adapter" / name).read_bytes())
    with pytest.raises(PrivacyRecordError):
        export_encoder_adapter(broken, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]
    export_encoder_adapter(runs / "topics" / "adapter", tmp_path / "out")
    export_encoder_adapter(runs / "sentiment" / "adapter", tmp_path / "out")  # replaces the previous export
    assert PrivacyRecord.load(tmp_path / "out").task == "sentiment"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "out"]


def test_records_are_found_beside_the_adapter_or_the_model(runs: Path) -> None:
    assert input_record(_ref(runs)).task == "sentiment"
    assert input_record(ModelReference.parse(str(runs / "full"))) == PrivacyRecord.load(runs / "full")
    assert input_record(ModelReference.parse(str(runs / "base"))) is None
    with pytest.raises(FileNotFoundError, match="adapter directory .* does not exist"):
        input_record(ModelReference.parse(f"{runs / 'base'}+{runs / 'missing'}"))


def test_noise_variance_uses_the_lora_factors_the_record_and_overrides(runs: Path) -> None:
    reference = _ref(runs)
    record = input_record(reference)
    lora = input_noise_variance(reference, QUERY, {})
    adapter = adapter_weights(runs / "sentiment" / "encoder_adapter")
    factors = adapter.factors[QUERY]
    assert not adapter.trained  # the encoder export holds LoRA weights only
    assert factors.scaling == 2.0  # lora_alpha 8 / r 4
    expected = lora_noise_variance(factors.lora_a, factors.lora_b, 2.0, record.sum_lr_squared, record.sum_lr_squared)
    torch.testing.assert_close(lora, expected)
    assert input_noise_variance(reference, "bert.pooler.dense.weight", {}) == 0.0  # frozen: no noise
    with_head = ModelReference.parse(f"{runs / 'base'}+{runs / 'sentiment' / 'adapter'}")
    assert "classifier.weight" in adapter_weights(runs / "sentiment" / "adapter").trained
    assert input_noise_variance(with_head, "classifier.weight", {}) == record.sum_lr_squared
    assert input_noise_variance(reference, QUERY, {"noise_std": 0.5}) == 0.25
    sgd = {"optimizer.name": "SGD", "optimizer.momentum": 0.5, "noise_multiplier": 2.0}
    expected_sgd = (2.0 * record.max_grad_norm / record.expected_batch_size) ** 2 * record.sum_lr_squared / 0.25
    assert input_noise_variance(with_head, "classifier.weight", sgd) == pytest.approx(expected_sgd)


def test_every_trained_head_tensor_keeps_its_own_name(lora_model, tmp_path: Path) -> None:
    """The head's bias maps to its own saved key (it used to be filed under classifier.weight, so the bias
    got noise variance 0 and the weight the bias's key)."""
    lora_model().save_pretrained(tmp_path)
    trained = adapter_weights(tmp_path).trained
    assert trained == {"classifier.weight": "base_model.model.classifier.weight",
                       "classifier.bias": "base_model.model.classifier.bias"}


def test_overrides_cover_the_noise_model_and_never_the_guarantee() -> None:
    for name in ("noise_multiplier", "max_grad_norm", "expected_batch_size", "sum_lr_squared"):
        assert name in RECORD_OVERRIDES
    assert RECORD_OVERRIDES["optimizer.momentum"] is float
    assert "optimizer" not in RECORD_OVERRIDES and "versions" not in RECORD_OVERRIDES
    for stated in ("epsilon", "delta", "dp", "accountant", "num_samples", "base_model_hash", "task"):
        assert stated not in RECORD_OVERRIDES  # the card states these: one YAML line must not change them


def test_missing_record_is_an_error_and_noise_estimate_is_refused(runs: Path) -> None:
    """`noise: estimate` (a MAD scale of the weights) zeroed most of a clean LoRA delta: it is refused up front."""
    from hf_dpmerge.merging.methods.registration import check_config

    full = ModelReference.parse(str(runs / "base"))  # has no record
    with pytest.raises(PrivacyRecordError, match="noise_std"):
        input_noise_variance(full, QUERY, {})
    config = _config(runs, [runs / "sentiment" / "encoder_adapter"], parameters={"noise": "estimate", "lambda": 1.0})
    with pytest.raises(ValueError, match="`noise: estimate` is not supported.*delete the `noise` key"):
        check_config(config, "cache")


def test_noise_statistics_travel_with_the_encoder_export(runs: Path, tmp_path: Path) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    for source in (runs / "topics" / "adapter").iterdir():
        (adapter / source.name).write_bytes(source.read_bytes())
    stats = NoiseStats(optimizer={"name": "AdamW", "betas": [0.9, 0.999], "eps": 1e-8}, noise_std=0.01,
                       lrs={"0": torch.full((5,), 1e-3, dtype=torch.float64)}, weight_decay={"0": 0.0},
                       groups={"w": "0"}, second_moments={"w": torch.ones(3)})
    stats.save(adapter)
    export_encoder_adapter(adapter, tmp_path / "encoder_adapter")
    copied = NoiseStats.load(tmp_path / "encoder_adapter")
    assert (tmp_path / "encoder_adapter" / NOISE_STATS_NAME).exists()
    assert copied.groups == stats.groups and torch.equal(copied.second_moments["w"], stats.second_moments["w"])


def test_a_factor_the_noise_statistics_do_not_list_was_frozen_and_carries_no_noise(runs: Path, tmp_path: Path) -> None:
    """FFA-LoRA trains only B: its statistics list no lora_A, so V_A = 0 and Var(ΔW) = s²·V_B·A² exactly (the
    record's Σ η² fallback used to be given to the frozen A)."""
    adapter = _copy_adapter(runs, tmp_path / "ffa")
    factors = adapter_weights(adapter).factors[QUERY]
    moment = torch.full_like(factors.lora_b, 1e-4)
    stats = NoiseStats(optimizer={"name": "AdamW", "betas": [0.9, 0.999], "eps": 1e-8}, noise_std=0.01,
                       lrs={"0": torch.full((5,), 1e-3, dtype=torch.float64)}, weight_decay={"0": 0.0},
                       groups={factors.saved_b: "0"}, second_moments={factors.saved_b: moment})
    stats.save(adapter)
    reference = ModelReference.parse(f"{runs / 'base'}+{adapter}")
    record = input_record(reference)
    variance_b = stats_noise_variance(record, stats, factors.saved_b)
    expected = factors.scaling**2 * (variance_b.double() @ factors.lora_a.double().square())
    torch.testing.assert_close(input_noise_variance(reference, QUERY, {}).double(), expected)


def test_a_head_noise_variance_is_capped_by_its_released_task_vector(runs: Path) -> None:
    """E[τ̃²] = τ² + s²: a head that moved less than the walk predicts gets s² at the upper confidence bound
    mean τ̃²·n/χ²_n(2.5 %); the per-model noise_std is the user's and is never capped."""
    from scipy.stats import chi2

    with_head = ModelReference.parse(f"{runs / 'base'}+{runs / 'sentiment' / 'adapter'}")
    walk = input_record(with_head).sum_lr_squared  # the record's Adam formula (no statistics shipped)
    shape = adapter_weights(runs / "sentiment" / "adapter").tensors["base_model.model.classifier.weight"].shape
    bound = 1e-6 * shape.numel() / chi2.ppf(0.025, shape.numel())
    assert input_noise_variance(with_head, "classifier.weight", {}, torch.full(shape, 1e-3)) == pytest.approx(bound)
    assert input_noise_variance(with_head, "classifier.weight", {}, torch.ones(shape)) == walk
    assert input_noise_variance(with_head, "classifier.weight", {"noise_std": 0.5}, torch.zeros(shape)) == 0.25


def test_misspelt_parameter_keys_are_errors(runs: Path) -> None:
    adapters = [runs / "sentiment" / "encoder_adapter"]
    config = _config(runs, adapters)
    config.models[0].parameters = {"wieght": 0.5}
    with pytest.raises(ValueError, match=r"'wieght' \(did you mean 'weight'\?\)"):
        check_parameter_keys(config, {"lambda"}, {"weight"})
    config.models[0].parameters = {"lambda": 0.5}  # a shared key per model is ignored by mergekit: an error too
    with pytest.raises(ValueError, match="per-model parameter 'lambda'"):
        check_parameter_keys(config, {"lambda"}, {"weight"})
    with pytest.raises(ValueError, match="unknown parameter 'lamda'"):
        check_parameter_keys(_config(runs, adapters, parameters={"lamda": 1.0}), {"lambda"}, {"weight"})


def test_input_checks_accept_good_inputs(runs: Path) -> None:
    adapters = [runs / "sentiment" / "encoder_adapter", runs / "topics" / "encoder_adapter"]
    check_inputs(_config(runs, adapters), lambda _: True, lora_cache="cache")


def _copy_adapter(runs: Path, target: Path) -> Path:
    target.mkdir(parents=True)
    for source in (runs / "sentiment" / "encoder_adapter").iterdir():
        (target / source.name).write_bytes(source.read_bytes())
    return target


def test_input_checks_reject_bad_inputs(runs: Path, tmp_path: Path) -> None:
    def check(adapter: Path, needs_noise=_no_noise_needed, lora_cache: str | None = "cache") -> None:
        check_inputs(_config(runs, [adapter]), needs_noise, lora_cache)

    with pytest.raises(FileNotFoundError, match="does not exist"):
        check(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="--lora-merge-cache"):
        check(runs / "sentiment" / "encoder_adapter", lora_cache=None)

    other_base = _copy_adapter(runs, tmp_path / "other_base")
    record = PrivacyRecord.load(other_base)
    record.base_model_hash = "sha256:" + "0" * 64
    record.save(other_base)
    with pytest.raises(ValueError, match="trained on another base model"):
        check(other_base)

    wrong_shape = _copy_adapter(runs, tmp_path / "wrong_shape")
    weights = load_file(wrong_shape / "adapter_model.safetensors")
    key = next(k for k in weights if ".lora_A." in k)
    weights[key] = torch.zeros(weights[key].shape[0], 7)
    save_file(weights, wrong_shape / "adapter_model.safetensors")
    with pytest.raises(ValueError, match="LoRA delta of shape"):
        check(wrong_shape)

    nan = _copy_adapter(runs, tmp_path / "nan")
    weights = load_file(nan / "adapter_model.safetensors")
    weights[key] = torch.full_like(weights[key], float("nan"))
    save_file(weights, nan / "adapter_model.safetensors")
    with pytest.raises(ValueError, match="NaN"):
        check(nan)

    unrecorded = _copy_adapter(runs, tmp_path / "unrecorded")
    (unrecorded / PRIVACY_RECORD_NAME).unlink()
    check(unrecorded)  # fine for a method that needs no noise model
    with pytest.raises(PrivacyRecordError, match="no dp_privacy.json"):
        check(unrecorded, needs_noise=lambda _: True)

    corrupt = _copy_adapter(runs, tmp_path / "corrupt")
    (corrupt / PRIVACY_RECORD_NAME).write_text("{not json")
    with pytest.raises(PrivacyRecordError, match="corrupt privacy record"):
        check(corrupt)


def test_full_model_inputs_are_checked_for_shape_and_nan(runs: Path, tmp_path: Path) -> None:
    def config(model: Path) -> MergeConfiguration:
        return MergeConfiguration.model_validate(
            {"merge_method": "dp_aware", "base_model": str(runs / "base"), "models": [{"model": str(model)}]}
        )

    check_inputs(config(runs / "full"), lambda _: True, lora_cache=None)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_bytes((runs / "full" / "config.json").read_bytes())
    weights = load_file(runs / "full" / "model.safetensors")
    weights["classifier.weight"] = torch.zeros(3, weights["classifier.weight"].shape[1])
    save_file(weights, bad / "model.safetensors")
    with pytest.raises(ValueError, match="classifier.weight: input .* has shape"):
        check_inputs(config(bad), _no_noise_needed, lora_cache=None)
    weights = load_file(runs / "full" / "model.safetensors")
    weights[QUERY][0, 0] = float("inf")
    save_file(weights, bad / "model.safetensors")
    with pytest.raises(ValueError, match=f"{QUERY}: input .* NaN or infinite"):
        check_inputs(config(bad), _no_noise_needed, lora_cache=None)


def test_model_card_section_states_method_parameters_and_each_inputs_budget(runs: Path) -> None:
    config = _config(runs, [runs / "sentiment" / "encoder_adapter", runs / "topics" / "encoder_adapter"],
                     parameters={"lambda": 0.5})
    config.models[1].parameters = {"noise_multiplier": 4.0}
    section = privacy_section(config)
    assert "**dp_aware**" in section and "`lambda`=0.5" in section and "`consensus`='none'" in section
    assert "`noise_multiplier`=4.0" in section
    epsilons = [row.split(" | ")[1] for row in section.split("The DP-SGD phases")[0].splitlines()
                if "/encoder_adapter | " in row]  # the ε table's rows (the phases table follows it)
    assert epsilons == ["8", "8"]  # the overridden noise does not change the recorded ε
    assert "(ε = 8, δ = 1e-05)-DP" in section
    plain = MergeConfiguration.model_validate(
        {"merge_method": "linear", "models": [{"model": str(runs / "base")}], "parameters": {"weight": 1.0}}
    )
    assert privacy_section(plain) is None
