"""Per-sample clipping, noise and the sharpness-aware gradient paths of DPSAMTrainer."""

import math

import pytest
import torch

from hf_dpmerge.modeling.per_example_loss import per_example_loss
from hf_dpmerge.modeling.sam_ascent import ascent_step, perturbed
from hf_dpmerge.training.dp.privatizer import GradientPrivatizer
from tests.utils.tiny_models import tiny_bert, tiny_tokenizer
from tests.utils.training_helpers import collate, lm_dataset, make_trainer


def naive_clipped_sum(model, params, examples, max_grad_norm):
    """One example at a time, unpadded: its gradient over all trainable params, clipped jointly."""
    total = [torch.zeros_like(p) for p in params]
    for features, label in examples:
        loss = per_example_loss(model(**features).logits, label).sum()
        grads = torch.autograd.grad(loss, params)
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        factor = min(1.0, max_grad_norm / (norm.item() + 1e-6))
        for t, g in zip(total, grads):
            t.add_(factor * g)
    return total


@pytest.mark.parametrize("sam_mode", ["none", "per_example"])
def test_clipped_sum_matches_naive_loop_with_padding_and_microbatches(tmp_path, sam_mode):
    trainer = make_trainer(tmp_path, noise_multiplier=0.0, per_sample_max_grad_norm=0.05,
                           physical_batch_size=3, sam_mode=sam_mode, sam_rho=0.0)
    model = trainer.model
    model.train()
    rows = [0, 1, 2, 3, 5, 6, 9]  # different lengths -> padding inside micro-batches of 3
    inputs = collate(trainer, rows)
    released, _ = trainer._query(model, inputs)
    tok = tiny_tokenizer()
    examples = []
    for i in rows:
        enc = tok(trainer.train_dataset[i]["text"], return_tensors="pt")
        examples.append(({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]},
                         torch.tensor([trainer.train_dataset[i]["label"]])))
    expected = naive_clipped_sum(model, trainer._params, examples, 0.05)
    for got, want in zip(released, expected):
        want = want / trainer.expected_batch_size
        assert torch.linalg.norm(got - want) <= 1e-5 * torch.linalg.norm(want) + 1e-9


def test_every_clipped_contribution_is_at_most_c():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(3, 4)), torch.nn.Parameter(torch.zeros(5))]
    scale = torch.logspace(-3, 2, 10)
    per_sample = [torch.randn(10, 3, 4) * scale[:, None, None], torch.randn(10, 5) * scale[:, None]]
    privatizer = GradientPrivatizer(params, max_grad_norm=0.7, noise_multiplier=0.0, expected_batch_size=10)
    norms = privatizer.accumulate(per_sample)
    factors = (0.7 / (norms + 1e-6)).clamp(max=1.0)
    assert torch.all(norms * factors <= 0.7 * (1 + 1e-6))
    assert (norms < 0.7).any() and (norms > 0.7).any()  # both regimes exercised
    released = privatizer.release()
    manual = [torch.einsum("i,i...->...", factors, g) / 10 for g in per_sample]
    for got, want in zip(released, manual):
        torch.testing.assert_close(got, want)


def test_noise_std_is_sigma_c_over_expected_batch():
    params = [torch.nn.Parameter(torch.zeros(200, 50))]
    sigma, c, b = 1.3, 0.4, 16
    generator = torch.Generator().manual_seed(123)
    privatizer = GradientPrivatizer(params, max_grad_norm=c, noise_multiplier=sigma, expected_batch_size=b,
                                    generator=generator)
    samples = torch.stack([privatizer.release()[0] for _ in range(20)])  # 200k draws, zero signal
    expected = sigma * c / b
    # sample std of n normals has relative s.e. ~ 1/sqrt(2n) ~ 0.0016; allow 5 s.e.
    assert abs(samples.std().item() / expected - 1) < 0.008
    assert abs(samples.mean().item()) < 5 * expected / math.sqrt(samples.numel())


def test_empty_draw_is_a_noise_only_step(tmp_path):
    trainer = make_trainer(tmp_path, noise_multiplier=1.0)
    empty = collate(trainer, [0])
    empty = {k: v[:0] for k, v in empty.items()}
    released, loss = trainer._query(trainer.model, empty)
    assert loss.item() == 0.0
    assert all(g.shape == p.shape for g, p in zip(released, trainer._params))
    assert all(g.abs().sum() > 0 for g in released)


def test_perturbation_restore_is_bit_exact():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(7, 3)), torch.nn.Parameter(torch.randn(3))]
    before = [p.detach().clone() for p in params]
    step = ascent_step([torch.randn(7, 3), torch.randn(3)], rho=0.37)
    with perturbed(params, step):
        assert not torch.equal(params[0], before[0])
        norm = torch.sqrt(sum((p - b).pow(2).sum() for p, b in zip(params, before)))
        assert abs(norm.item() - 0.37) < 1e-5
    assert all(torch.equal(p, b) for p, b in zip(params, before))


def _final_params(tmp_path, name, **overrides):
    trainer = make_trainer(tmp_path / name, align_lambda=0.0, **overrides)
    trainer.train()
    return [p.detach().clone() for p in trainer._params]


def test_dp_sat_with_zero_rho_equals_dp_sgd_and_differs_with_positive_rho(tmp_path):
    sgd = _final_params(tmp_path, "sgd", sam_mode="none")
    sat0 = _final_params(tmp_path, "sat0", sam_mode="dp_sat", sam_rho=0.0)
    sat = _final_params(tmp_path, "sat", sam_mode="dp_sat", sam_rho=0.5)
    assert all(torch.equal(a, b) for a, b in zip(sgd, sat0))
    assert any(not torch.allclose(a, b) for a, b in zip(sgd, sat))


def test_lora_parameters_change_after_a_step(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=1)
    before = [p.detach().clone() for p in trainer._params]
    trainer.train()
    names = trainer._param_names
    changed = {n for n, b, p in zip(names, before, trainer._params) if not torch.equal(b, p)}
    assert changed == set(names)
    assert any("lora_A" in n for n in changed) and any("lora_B" in n for n in changed)


def test_causal_lm_clipped_sum_matches_naive_loop(tmp_path, lora_model):
    model = lora_model("causal_lm")
    tok = tiny_tokenizer()
    from transformers import DataCollatorForLanguageModeling
    texts = ["the film was a delight", "dull script", "markets rallied as oil prices fell sharply"] * 10
    ds = lm_dataset(texts)
    trainer = make_trainer(tmp_path, model=model, dataset=ds, noise_multiplier=0.0, per_sample_max_grad_norm=0.1,
                           physical_batch_size=2, sam_mode="none", remove_unused_columns=False)
    trainer.data_collator = DataCollatorForLanguageModeling(tok, mlm=False)
    model.train()
    inputs = trainer._prepare_inputs(trainer.data_collator([ds[i] for i in range(3)]))
    released, _ = trainer._query(model, inputs)
    examples = []
    for i in range(3):
        enc = tok(texts[i], return_tensors="pt")
        examples.append(({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}, enc["input_ids"]))
    expected = naive_clipped_sum(model, trainer._params, examples, 0.1)
    for got, want in zip(released, expected):
        torch.testing.assert_close(got, want / trainer.expected_batch_size, rtol=1e-5, atol=1e-8)


def test_head_learning_rate_steps_the_head_at_its_own_rate(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=1, optim="sgd", head_learning_rate=0.5, lr_scheduler_type="constant")
    optimizer = trainer.create_optimizer()
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    grads = {}
    optimizer.register_step_pre_hook(lambda opt, *_: grads.update(
        {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}))
    trainer.train()
    rates = {n: float(((before[n] - p.detach()) * grads[n]).sum() / grads[n].pow(2).sum())
             for n, p in trainer.model.named_parameters() if n in grads and grads[n].abs().sum() > 0}
    head = [r for n, r in rates.items() if ".modules_to_save." in n]
    lora = [r for n, r in rates.items() if "lora_" in n]
    assert head and lora
    assert all(r == pytest.approx(0.5, rel=1e-4) for r in head)
    assert all(r == pytest.approx(1e-2, rel=1e-4) for r in lora)
    assert trainer.privacy_record().optimizer["head_lr"] == 0.5


def test_automatic_clipping_normalises_every_contribution_below_one():
    """clipping='automatic': each contribution is g_i/(‖g_i‖+γ), of norm < 1 (sensitivity 1, whatever C says),
    and the noise is N(0, σ²·1²) before the division by B_exp."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(3, 4)), torch.nn.Parameter(torch.zeros(5))]
    scale = torch.logspace(-4, 3, 10)
    per_sample = [torch.randn(10, 3, 4) * scale[:, None, None], torch.randn(10, 5) * scale[:, None]]
    gamma = 0.05
    privatizer = GradientPrivatizer(params, max_grad_norm=0.7, noise_multiplier=0.0, expected_batch_size=10,
                                    clipping="automatic", gamma=gamma)
    contributions = []
    for i in range(10):  # one example at a time: the released sum is that example's contribution (×B_exp)
        privatizer.accumulate([g[i : i + 1] for g in per_sample])
        contributions.append([g * 10 for g in privatizer.release()])
    norms = torch.sqrt(per_sample[0].pow(2).sum(dim=(1, 2)) + per_sample[1].pow(2).sum(dim=1))
    for i, contribution in enumerate(contributions):
        total = torch.sqrt(sum(c.pow(2).sum() for c in contribution))
        assert total < 1
        for got, g in zip(contribution, per_sample):
            torch.testing.assert_close(got, g[i] / (norms[i] + gamma))
    assert norms.max() > 0.7 > norms.min()  # flat clipping would have left the small ones unscaled
    noisy = GradientPrivatizer([torch.nn.Parameter(torch.zeros(200, 50))], max_grad_norm=0.4, noise_multiplier=1.3,
                               expected_batch_size=16, generator=torch.Generator().manual_seed(1),
                               clipping="automatic")
    samples = torch.stack([noisy.release()[0] for _ in range(20)])
    assert abs(samples.std().item() / (1.3 / 16) - 1) < 0.008  # σ·1/B_exp, not σ·C/B_exp


def test_automatic_clipping_is_recorded_with_sensitivity_one(tmp_path):
    trainer = make_trainer(tmp_path, clipping="automatic", clipping_gamma=0.02, per_sample_max_grad_norm=0.3,
                           max_steps=1)
    trainer.train()
    record = trainer.privacy_record()
    assert record.max_grad_norm == 1.0 and record.extra["clipping"] == {"mode": "automatic", "gamma": 0.02}


def test_per_example_sam_on_the_mean_pooling_classifier_matches_a_naive_loop(tmp_path):
    """The packaged encoders' head pools by the padding mask: per-example SAM (torch.func, a prepared additive
    mask) gives each padded example its gradient at its own ascent point w + ρ·g_i/‖g_i‖, clipped, as a loop over
    unpadded examples with the plain mask does."""
    from peft import LoraConfig, get_peft_model

    from hf_dpmerge.modeling.mean_pooling import MeanPoolingBertForSequenceClassification

    torch.manual_seed(0)
    encoder = MeanPoolingBertForSequenceClassification(tiny_bert().config)
    model = get_peft_model(encoder, LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"],
                                               modules_to_save=["classifier"], task_type="SEQ_CLS"))
    rho, clip = 0.5, 0.05
    trainer = make_trainer(tmp_path, model=model, noise_multiplier=0.0, per_sample_max_grad_norm=clip,
                           physical_batch_size=3, sam_mode="per_example", sam_rho=rho)
    model.train()
    rows = [0, 1, 2, 3, 5, 6, 9]  # different lengths: padding inside micro-batches of 3
    released, _ = trainer._query(model, collate(trainer, rows))
    params, tok = trainer._params, tiny_tokenizer()
    expected = [torch.zeros_like(p) for p in params]
    for i in rows:
        features = dict(tok(trainer.train_dataset[i]["text"], return_tensors="pt"))
        label = torch.tensor([trainer.train_dataset[i]["label"]])

        def gradient(features=features, label=label):
            return torch.autograd.grad(per_example_loss(model(**features).logits, label).sum(), params)

        first = gradient()
        norm = torch.sqrt(sum(g.pow(2).sum() for g in first))
        with torch.no_grad():
            for p, g in zip(params, first):
                p.add_(rho * g / norm)
        ascended = gradient()
        with torch.no_grad():
            for p, g in zip(params, first):
                p.sub_(rho * g / norm)
        norm = torch.sqrt(sum(g.pow(2).sum() for g in ascended))
        for total, g in zip(expected, ascended):
            total.add_(min(1.0, clip / (norm.item() + 1e-6)) * g)
    for got, want in zip(released, expected):
        want = want / trainer.expected_batch_size
        assert torch.linalg.norm(got - want) <= 1e-4 * torch.linalg.norm(want) + 1e-9
