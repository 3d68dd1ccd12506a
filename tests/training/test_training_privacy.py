"""Accounting, the alignment penalty, the privacy record, resuming and refused configurations."""

import json
import math

import pytest
import torch
from opacus.accountants import create_accountant

from hf_dpmerge import DPSAMConfig, PrivacyRecord
from hf_dpmerge.lora import UnsupportedAdapterError
from hf_dpmerge.records.fingerprint import base_fingerprint
from hf_dpmerge.training.alignment import alignment_penalty
from tests.utils.tiny_models import tiny_bert
from tests.utils.training_helpers import lora_classifier, make_trainer, text_dataset


def opacus_epsilon(mechanism, sigma, q, steps, delta):
    accountant = create_accountant(mechanism)
    for _ in range(steps):
        accountant.step(noise_multiplier=sigma, sample_rate=q)
    return accountant.get_epsilon(delta=delta)


@pytest.mark.parametrize("mechanism", ["rdp", "prv"])
def test_reported_epsilon_equals_opacus_fed_the_same_history(tmp_path, mechanism):
    trainer = make_trainer(tmp_path, accountant=mechanism, max_steps=3, logging_steps=1)
    trainer.train()
    want = opacus_epsilon(mechanism, trainer.noise_multiplier, trainer.sample_rate, 3, trainer.delta)
    assert trainer.accountant.epsilon() == pytest.approx(want, rel=1e-9)
    logged = [entry["dp_epsilon"] for entry in trainer.state.log_history if "dp_epsilon" in entry]
    assert logged and logged[-1] == pytest.approx(want, abs=1e-4)
    assert want <= 4.0  # calibrated to the target


def test_two_query_is_one_step_at_sigma_over_sqrt2_and_others_match_dp_sgd(tmp_path):
    eps = {}
    for mode in ("none", "dp_sat", "per_example", "two_query"):
        trainer = make_trainer(tmp_path / mode, sam_mode=mode, max_steps=2, noise_multiplier=1.2)
        trainer.train()
        eps[mode] = trainer.accountant.epsilon()
        if mode == "two_query":
            assert trainer.effective_noise_multiplier == pytest.approx(1.2 / math.sqrt(2))
            want = opacus_epsilon("rdp", 1.2 / math.sqrt(2), trainer.sample_rate, 2, trainer.delta)
            assert eps[mode] == pytest.approx(want, rel=1e-9)
    assert eps["dp_sat"] == eps["per_example"] == eps["none"]
    assert eps["two_query"] > eps["none"]


def test_two_query_calibration_still_meets_the_target(tmp_path):
    trainer = make_trainer(tmp_path, sam_mode="two_query", max_steps=5, target_epsilon=3.0)
    one_query = make_trainer(tmp_path / "b", sam_mode="none", max_steps=5, target_epsilon=3.0)
    assert trainer.noise_multiplier == pytest.approx(one_query.noise_multiplier * math.sqrt(2))
    assert 2.9 <= trainer.accountant.epsilon_after(5) <= 3.0


def test_epsilon_budget_stops_training_before_it_is_exceeded(tmp_path):
    trainer = make_trainer(tmp_path, noise_multiplier=0.9, epsilon_budget=2.0, target_epsilon=None, max_steps=50)
    assert 0 < trainer.allowed_steps < 50
    trainer.train()
    assert trainer.state.global_step == trainer.allowed_steps
    assert trainer.accountant.epsilon() <= 2.0
    assert trainer.accountant.epsilon_after(trainer.allowed_steps + 1) > 2.0


def _materialised_penalty(model, lam):
    total = 0.0
    for module in model.modules():
        if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {}):
            delta = module.scaling["default"] * module.lora_B["default"].weight @ module.lora_A["default"].weight
            total = total + delta.pow(2).sum()
    return lam * total


@pytest.mark.parametrize("use_rslora", [False, True])
def test_penalty_and_gradients_equal_the_materialised_delta_version(use_rslora):
    model = lora_classifier(use_rslora=use_rslora, lora_alpha=6, init_lora_weights=False).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "modules_to_save" in name:
                p.add_(0.1)
    lora = [p for n, p in model.named_parameters() if p.requires_grad and "lora_" in n]
    heads = [p for n, p in model.named_parameters() if p.requires_grad and "modules_to_save" in n]
    ours = alignment_penalty(model, 0.3)
    theirs = _materialised_penalty(model, 0.3)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)
    for g1, g2 in zip(torch.autograd.grad(ours, lora, retain_graph=True), torch.autograd.grad(theirs, lora)):
        torch.testing.assert_close(g1, g2, rtol=1e-10, atol=1e-12)
    # the (moved) task heads are never merged, so they are not pulled back to their initialisation
    assert heads and all(g is None for g in torch.autograd.grad(ours, heads, allow_unused=True))
    assert ours > 0


def test_dora_is_refused_with_a_clear_error(tmp_path, lora_model):
    with pytest.raises(UnsupportedAdapterError, match="DoRA"):
        make_trainer(tmp_path, model=lora_model("dora"), align_lambda=0.1)


def test_privacy_record_is_complete_and_round_trips(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=2, sam_mode="two_query", align_lambda=0.05)
    trainer.train()
    trainer.save_model(str(tmp_path / "adapter"))
    data = json.loads((tmp_path / "adapter" / "dp_privacy.json").read_text())
    for key in ("schema_version", "epsilon", "delta", "accountant", "noise_multiplier",
                "effective_noise_multiplier", "sample_rate", "steps", "max_grad_norm", "expected_batch_size",
                "num_samples", "sam_mode", "sam_rho", "align_lambda", "optimizer", "sum_lr_squared",
                "base_model", "base_model_hash", "versions"):
        assert key in data, key
    record = PrivacyRecord.load(tmp_path / "adapter")
    assert record.steps == 2 and record.sam_mode == "two_query" and record.queries_per_step == 2
    assert record.epsilon == pytest.approx(trainer.accountant.epsilon())
    # Σ η² of the linear schedule actually used: lr·(1 - t/T) at t = 0, 1
    assert record.sum_lr_squared == pytest.approx(1e-2**2 * (1 + 0.5**2))
    base = {n: t for n, t in tiny_bert().state_dict().items() if n in record.base_model_hash_tensors}
    assert len(base) == len(record.base_model_hash_tensors) == 4
    assert record.base_model_hash == base_fingerprint(base)
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()


def test_resume_without_dp_state_is_refused(tmp_path):
    trainer = make_trainer(tmp_path)
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(FileNotFoundError, match="dp_state.pt"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "ckpt"))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(gradient_accumulation_steps=2), "gradient_accumulation_steps"),
        (dict(max_grad_norm=1.0), "max_grad_norm"),
        (dict(target_epsilon=0.0), "target_epsilon"),
        (dict(target_epsilon=-1.0), "target_epsilon"),
        (dict(target_epsilon=float("nan")), "target_epsilon"),
        (dict(target_delta=0.0), "target_delta"),
        (dict(per_sample_max_grad_norm=0.0), "per_sample_max_grad_norm"),
        (dict(sam_mode="sharp"), "sam_mode"),
        (dict(sam_rho=-0.1), "sam_rho"),
        (dict(accountant="gdp"), "accountant"),
        (dict(target_epsilon=None), "target_epsilon"),
        (dict(noise_multiplier=0.0), r"σ = 0 adds no noise: that is no DP; train with --dp false"),
    ],
)
def test_bad_configurations_raise_clear_errors(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        DPSAMConfig(output_dir=str(tmp_path), report_to="none", **overrides)


def test_dataset_level_errors(tmp_path):
    with pytest.raises(ValueError, match=r"1/N"):
        make_trainer(tmp_path, target_delta=0.01)
    assert make_trainer(tmp_path, target_delta=0.01, allow_large_delta=True).delta == 0.01
    with pytest.raises(ValueError, match="exceeds the dataset size 8: lower --per_device_train_batch_size"):
        make_trainer(tmp_path, dataset=text_dataset(copies=1), per_device_train_batch_size=20)
    frozen = lora_classifier()
    for p in frozen.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        make_trainer(tmp_path, model=frozen)


def test_non_private_mode_shares_the_trainer_and_records_infinite_epsilon(tmp_path):
    trainer = make_trainer(tmp_path, dp=False, sam_mode="two_query", max_steps=2, max_grad_norm=0.0)
    before = [p.detach().clone() for p in trainer._params]
    trainer.train()
    trainer.save_model(str(tmp_path / "adapter"))
    record = PrivacyRecord.load(tmp_path / "adapter")
    assert not record.dp and math.isinf(record.epsilon)
    assert all(not torch.equal(b, p) for b, p in zip(before, trainer._params))


def test_release_ships_noise_statistics_the_merge_uses(tmp_path):
    """dp_noise_stats.safetensors: Adam's v̂ for every released tensor, η_t per group (the head's at its own
    rate) matching the record's Σ η², and σ·C/B_exp; dp_aware then needs no fallback formula."""
    import warnings

    from mergekit.common import ModelReference
    from safetensors.torch import load_file

    from hf_dpmerge.merging.inputs import input_noise_variance
    from hf_dpmerge.records.noise_record import NoiseStats

    trainer = make_trainer(tmp_path, lr_scheduler_type="linear", head_learning_rate=0.1)
    trainer.train()
    trainer.save_model(str(tmp_path / "release"))
    stats, record = NoiseStats.load(tmp_path / "release"), PrivacyRecord.load(tmp_path / "release")
    weights = load_file(tmp_path / "release" / "adapter_model.safetensors")
    assert set(stats.groups) == set(weights) == set(stats.second_moments)
    assert all(stats.second_moments[k].shape == weights[k].shape for k in weights)
    encoder_lrs = stats.lrs[stats.groups[next(k for k in weights if ".lora_A." in k)]]
    head_lrs = stats.lrs[stats.groups[next(k for k in weights if "classifier" in k)]]
    assert float(encoder_lrs.square().sum()) == pytest.approx(record.sum_lr_squared, rel=1e-9)
    torch.testing.assert_close(head_lrs, 10 * encoder_lrs)
    assert encoder_lrs[-1] < encoder_lrs[0]  # the linear schedule, replayed
    assert stats.noise_std == pytest.approx(record.noise_multiplier * record.max_grad_norm / record.expected_batch_size)
    reference = ModelReference.parse(f"{tmp_path / 'base'}+{tmp_path / 'release'}")
    (tmp_path / "base").mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "no dp_noise_stats" fallback warning
        variance = input_noise_variance(reference, "bert.encoder.layer.0.attention.self.query.weight", {})
    assert variance.shape == (32, 32) and bool((variance > 0).all())


def test_memoised_accounting_answers_as_a_fresh_accountant_for_each_history_and_delta():
    """ε and σ are memoised per process; every answer is still the one a fresh accountant gives its arguments."""
    from dp_accounting import dp_event
    from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
    from dp_accounting.privacy_accountant import NeighboringRelation
    from opacus.accountants.utils import get_noise_multiplier

    from hf_dpmerge.training.dp.accounting import (
        PLD_DISCRETIZATION,
        calibrate_noise_multiplier,
        history_epsilon,
        replace_one_epsilon,
    )

    cases = [([(1.0, 0.1, 20)], 1e-5), ([(1.0, 0.1, 20)], 1e-3), ([(1.0, 0.1, 20), (2.0, 0.2, 5)], 1e-5),
             ([(1.0, 0.1, 20)], 1e-5)]  # the last one asked again: a hit
    for history, delta in cases:
        fresh = create_accountant("rdp")
        fresh.history = list(history)
        assert history_epsilon("rdp", [list(entry) for entry in history], delta) == fresh.get_epsilon(delta=delta)
    for (sigma, q, steps), delta in [((1.0, 0.1, 20), 1e-5), ((1.0, 0.1, 20), 1e-3), ((1.0, 0.1, 20), 1e-5)]:
        fresh = PLDAccountant(NeighboringRelation.REPLACE_ONE, value_discretization_interval=PLD_DISCRETIZATION)
        fresh.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
        assert replace_one_epsilon(effective_noise_multiplier=sigma, sample_rate=q, steps=steps,
                                   delta=delta) == fresh.get_epsilon(delta)
    for epsilon in (8.0, 4.0, 8.0):
        assert calibrate_noise_multiplier(target_epsilon=epsilon, target_delta=1e-5, sample_rate=0.1, steps=20,
                                          accountant="rdp") == get_noise_multiplier(
            target_epsilon=epsilon, target_delta=1e-5, sample_rate=0.1, steps=20, accountant="rdp",
            epsilon_tolerance=0.01)


def test_prv_accounting_prints_no_rdp_order_warning():
    import warnings

    from hf_dpmerge.training.dp import accounting
    from hf_dpmerge.training.dp.accounting import PrivacyAccountant, calibrate_noise_multiplier

    accounting._opacus_noise_multiplier.cache_clear()  # an earlier test's calibration would hide the warning
    accounting._accountant_epsilon.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sigma = calibrate_noise_multiplier(target_epsilon=8, target_delta=1e-5, sample_rate=0.032, steps=40,
                                           accountant="prv")
        accountant = PrivacyAccountant("prv", sigma, 0.032, 1e-5)
        for _ in range(40):
            accountant.step()
        assert 7.9 < accountant.epsilon() <= 8.0
    assert not [w for w in caught if "Optimal order" in str(w.message)]
