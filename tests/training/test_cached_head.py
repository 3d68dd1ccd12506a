"""The head-only release trained on cached pooled features: the same clipped gradient as the full model, the
same accountant, and the same kind of release."""

import pytest
import torch

from hf_dpmerge.modeling.per_example_loss import per_example_loss
from hf_dpmerge.modeling.pooled_features import task_head
from hf_dpmerge.training.cached_head import FEATURES
from tests.utils.training_helpers import collate, head_only_classifier, make_cached_head_trainer, make_trainer


def test_cached_step_gives_the_full_model_gradient(tmp_path):
    """Same rows, no noise, C small enough to clip: the cached head's released gradient equals the full-model
    path's (frozen LoRA, no dropout), parameter by parameter."""
    settings = dict(noise_multiplier=0.0, per_sample_max_grad_norm=0.05, physical_batch_size=3, sam_mode="none",
                    align_lambda=0.0)
    full = make_trainer(tmp_path / "full", model=head_only_classifier(), **settings)
    cached = make_cached_head_trainer(tmp_path / "cached", **settings)
    rows = [0, 1, 2, 3, 5, 6, 9]
    want, want_loss = full._query(full.model, collate(full, rows))
    got, got_loss = cached._query(cached.model, cached._prepare_inputs(cached.data_collator(rows)))
    assert cached._param_names == full._param_names and len(got) == 2  # the head's weight and bias
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(got_loss, want_loss)


def test_cached_per_sample_gradients_are_clipped_to_c(tmp_path):
    c = 0.02
    trainer = make_cached_head_trainer(tmp_path, noise_multiplier=0.0, per_sample_max_grad_norm=c, sam_mode="none")
    rows = list(range(12))
    batch = trainer._prepare_inputs(trainer.data_collator(rows))
    weight, bias = (p.detach().clone().requires_grad_() for p in trainer._params)  # the head, outside opacus
    assert weight.shape == task_head(trainer.model).weight.shape
    norms, expected = [], [torch.zeros_like(weight), torch.zeros_like(bias)]
    for i in rows:
        logits = torch.nn.functional.linear(batch[FEATURES][i : i + 1], weight, bias)
        grads = torch.autograd.grad(per_example_loss(logits, batch["labels"][i : i + 1]).sum(), (weight, bias))
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        norms.append(norm.item())
        for total, g in zip(expected, grads):
            total.add_(g * min(1.0, c / (norm.item() + 1e-6)))
    assert max(norms) > c  # clipping is exercised
    released, _ = trainer._query(trainer.model, batch)
    for got, want in zip(released, expected):
        torch.testing.assert_close(got, want / trainer.expected_batch_size, rtol=1e-5, atol=1e-9)


def test_cached_training_spends_the_accountants_epsilon_and_releases_a_head_only_adapter(tmp_path):
    from opacus.accountants import create_accountant

    trainer = make_cached_head_trainer(tmp_path, max_steps=30, target_epsilon=2.0, logging_steps=30)
    lora_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if ".lora_" in n}
    head_before = [p.detach().clone() for p in trainer._params]
    trainer.train()
    accountant = create_accountant("rdp")
    accountant.history = [(trainer.noise_multiplier, trainer.sample_rate, 30)]
    record = trainer.privacy_record()
    assert record.steps == 30 and record.epsilon == pytest.approx(accountant.get_epsilon(trainer.delta), rel=1e-9)
    assert record.epsilon <= 2.0
    assert all(torch.equal(p, lora_before[n]) for n, p in trainer.model.named_parameters() if ".lora_" in n)
    assert all(not torch.equal(p, before) for p, before in zip(trainer._params, head_before))
    trainer.save_model(str(tmp_path / "release"))
    assert (tmp_path / "release" / "adapter_model.safetensors").exists()
    assert (tmp_path / "release" / "dp_privacy.json").exists()


def test_trainable_lora_is_refused_on_cached_features(tmp_path):
    from tests.utils.training_helpers import lora_classifier

    with pytest.raises(ValueError, match="--train_lora false"):
        make_cached_head_trainer(tmp_path, model=lora_classifier())


def test_frozen_lora_with_alignment_trains_and_records_no_alignment(tmp_path):
    """The default recipe's λ > 0 on a model whose LoRA factors are all frozen: R(w) has nothing to act on, so
    it is skipped (before: autograd.grad over frozen factors raised) and the record says λ = 0."""
    trainer = make_trainer(tmp_path, model=head_only_classifier(), align_lambda=0.05, sam_mode="dp_sat", max_steps=2)
    trainer.train()
    assert trainer.state.global_step == 2 and trainer.privacy_record().align_lambda == 0.0
    assert make_trainer(tmp_path / "lora", align_lambda=0.05).align_lambda == 0.05  # trainable LoRA: kept
