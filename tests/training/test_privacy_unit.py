"""User-level DP (``privacy_unit_column``): Poisson sampling of units, per-unit clipping of summed gradients,
accounting on the number of units, and the refusals around it."""

import numpy as np
import pytest
import torch
from datasets import Dataset
from opacus.accountants import create_accountant

from hf_dpmerge import DPSAMConfig, PrivacyRecord
from hf_dpmerge.audit.audit import audit_training
from hf_dpmerge.data.tasks import TaskSpec
from hf_dpmerge.modeling.per_example_loss import per_example_loss
from hf_dpmerge.training.dp.poisson_loader import UNIT_KEY, UnitPoissonSampler
from hf_dpmerge.training.dp.privatizer import GradientPrivatizer
from tests.utils.tiny_models import CORPUS, tiny_tokenizer
from tests.utils.training_helpers import UNITS as NUM_UNITS
from tests.utils.training_helpers import lora_classifier, make_trainer, unit_dataset


def unit_trainer(tmp_path, dataset=None, **overrides):
    """A tiny trainer over 40 authors of 5 rows each, drawing 4 authors (20 rows) per step on average."""
    dataset = unit_dataset() if dataset is None else dataset
    settings = {"per_device_train_batch_size": 4, **overrides}
    return make_trainer(tmp_path, dataset=dataset, privacy_unit_column="author", **settings)


def naive_unit_clipped_sum(model, params, rows_by_unit, dataset, max_grad_norm):
    """Unit by unit, row by row unpadded: Σ over the unit's rows of the gradient, clipped jointly to C."""
    tok = tiny_tokenizer()
    total = [torch.zeros_like(p) for p in params]
    for rows in rows_by_unit:
        unit_sum = [torch.zeros_like(p) for p in params]
        for i in rows:
            enc = tok(dataset[i]["text"], return_tensors="pt")
            logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
            loss = per_example_loss(logits, torch.tensor([dataset[i]["label"]])).sum()
            for s, g in zip(unit_sum, torch.autograd.grad(loss, params)):
                s.add_(g)
        norm = torch.sqrt(sum(s.pow(2).sum() for s in unit_sum))
        factor = min(1.0, max_grad_norm / (norm.item() + 1e-6))
        for t, s in zip(total, unit_sum):
            t.add_(factor * s)
    return total


def test_unit_clipped_sum_matches_naive_per_unit_loop_across_microbatches(tmp_path):
    trainer = unit_trainer(tmp_path, noise_multiplier=0.0, target_epsilon=None, per_sample_max_grad_norm=0.05,
                           physical_batch_size=3, sam_mode="none")
    model = trainer.model
    model.train()
    # units 3, 7 and 11, rows interleaved so each unit spans several micro-batches of 3
    rows = [3, 7, 43, 11, 47, 83, 51, 123, 87, 163, 3 + 160]
    dataset = trainer.train_dataset.remove_columns(["text"])
    inputs = trainer._prepare_inputs(trainer.data_collator([dataset[i] for i in rows]))
    units = torch.as_tensor(trainer.unit_of_row[rows])
    released, _ = trainer._query(model, inputs, units)
    per_row, _ = trainer._query(model, inputs)  # per-row clipping, for contrast
    rows_by_unit = [[r for r in rows if r % NUM_UNITS == u] for u in (3, 7, 11)]
    expected = naive_unit_clipped_sum(model, trainer._params, rows_by_unit, trainer.train_dataset, 0.05)
    for got, want in zip(released, expected):
        want = want / trainer.expected_batch_size
        assert torch.linalg.norm(got - want) <= 1e-6 * torch.linalg.norm(want) + 1e-9
    # per-row clipping gives another answer: the check above tells the two apart
    assert any(not torch.allclose(a, b, rtol=1e-3) for a, b in zip(per_row, released))


def test_draws_take_whole_units_at_rate_q_and_processes_share_them_by_unit():
    units = np.arange(600) % 60
    q, steps = 0.25, 400

    def draws(num_processes, index):
        sampler = UnitPoissonSampler(units, sample_rate=q, steps=steps, generator=torch.Generator().manual_seed(5),
                                     num_processes=num_processes, process_index=index)
        return [set(batch) for batch in sampler]

    single = draws(1, 0)
    shares = [draws(2, 0), draws(2, 1)]
    counts = np.zeros(60)
    for step, batch in enumerate(single):
        drawn = {r % 60 for r in batch}
        assert batch == {r for r in range(600) if r % 60 in drawn}  # every row of every drawn unit
        counts[list(drawn)] += 1
        first, second = shares[0][step], shares[1][step]
        assert first | second == batch and not {r % 60 for r in first} & {r % 60 for r in second}
    # each unit joins a draw with probability q: 400 draws, s.d. of a unit's count ≈ 8.7
    assert abs(counts.mean() / steps - q) < 0.01 and counts.min() > steps * q - 40


def test_epsilon_is_accounted_on_the_number_of_units_and_the_record_says_per_unit(tmp_path):
    trainer = unit_trainer(tmp_path, max_steps=3, sam_mode="two_query", noise_multiplier=1.5, target_epsilon=None,
                           epsilon_budget=50.0)
    assert trainer.num_units == NUM_UNITS and trainer.num_samples == 200
    assert trainer.sample_rate == pytest.approx(4 / NUM_UNITS)
    assert trainer.delta == pytest.approx(1 / (10 * NUM_UNITS))
    trainer.train()
    accountant = create_accountant("rdp")
    accountant.history = [(1.5 / np.sqrt(2), 4 / NUM_UNITS, 3)]
    record = trainer.privacy_record()
    assert record.epsilon == pytest.approx(accountant.get_epsilon(delta=1 / (10 * NUM_UNITS)), rel=1e-9)
    assert record.privacy_unit == "unit:author" and record.unit_column == "author"
    assert record.num_units == NUM_UNITS and record.num_samples == 200
    assert record.epsilon_replace_one is not None and record.epsilon_replace_one > 0


@pytest.mark.parametrize("sam_mode", ["dp_sat", "none"])
def test_unit_level_trains_with_the_column_removed_before_the_forward(tmp_path, sam_mode):
    # remove_unused_columns=False: Trainer would pass the string column on; the trainer must drop it itself
    trainer = unit_trainer(tmp_path, max_steps=2, sam_mode=sam_mode, remove_unused_columns=False,
                           dataset=unit_dataset().remove_columns(["text"]))
    assert "author" not in trainer.train_dataset.column_names
    batch = next(iter(trainer.get_train_dataloader()))
    assert UNIT_KEY in batch and set(batch[UNIT_KEY].tolist()) <= set(range(NUM_UNITS))
    before = [p.detach().clone() for p in trainer._params]
    trainer.train()
    assert any(not torch.equal(b, p) for b, p in zip(before, trainer._params))


def test_missing_unit_column_and_per_example_sam_are_refused(tmp_path):
    with pytest.raises(ValueError, match="privacy_unit_column='patient'.*not a column"):
        make_trainer(tmp_path, privacy_unit_column="patient")
    with pytest.raises(ValueError, match="per_example.*privacy_unit_column"):
        DPSAMConfig(output_dir=str(tmp_path), privacy_unit_column="author", sam_mode="per_example")
    with pytest.raises(ValueError, match="number of privacy units"):
        unit_trainer(tmp_path, per_device_train_batch_size=NUM_UNITS + 1)


TOY10 = TaskSpec("toy10", 10, tuple(f"class{i}" for i in range(10)), ("text",), "accuracy", "packaged")


def unit_audit(tmp_path, rows_per_canary=2, **overrides):
    """An audit with canary *units*: 40 one-word canaries of ``rows_per_canary`` rows each (10 random labels)
    beside 8 task authors of 5 rows, k₊ = k₋ = 8 fixed in advance."""
    settings = {
        "output_dir": str(tmp_path / "audit"), "per_device_train_batch_size": 8, "physical_batch_size": 32,
        "max_steps": 60, "learning_rate": 0.1, "lr_scheduler_type": "constant", "weight_decay": 0.0,
        "sam_mode": "none", "align_lambda": 0.0, "target_delta": 1e-5, "accountant": "rdp", "seed": 0,
        "dp_seed": 0, "use_cpu": True, "report_to": "none", "save_strategy": "no", "disable_tqdm": True,
        "privacy_unit_column": "author", **overrides,
    }
    train = Dataset.from_dict({"text": CORPUS * 5, "label": [i % 2 for i in range(40)],
                               "author": [i % 8 for i in range(40)]})
    return audit_training(
        lora_classifier(num_labels=10), tiny_tokenizer(), train, TOY10, DPSAMConfig(**settings),
        num_canaries=40, k_plus=8, k_minus=8, canary_length=1, seed=0, rows_per_canary=rows_per_canary,
    )


def test_audit_with_canary_units_refutes_a_trainer_that_drops_the_noise(tmp_path, monkeypatch):
    from hf_dpmerge.training import dpsam_trainer

    class NoiselessPrivatizer(GradientPrivatizer):
        def __init__(self, params, **settings):
            super().__init__(params, **{**settings, "noise_multiplier": 0.0})

    monkeypatch.setattr(dpsam_trainer, "GradientPrivatizer", NoiselessPrivatizer)
    result = unit_audit(tmp_path, target_epsilon=1.0)
    record = PrivacyRecord.load(result.adapter_dir)
    assert record.privacy_unit == "unit:author" and record.num_units == 8 + result.num_included
    assert record.num_samples == 40 + 2 * result.num_included and result.rows_per_canary == 2
    assert 0.9 < result.claimed_epsilon <= 1.0
    assert result.epsilon_lower > result.claimed_epsilon
    assert "units of 2 rows" in result.summary()


@pytest.mark.slow
def test_audit_with_canary_units_stays_below_the_claim(tmp_path):
    result = unit_audit(tmp_path, target_epsilon=1.0)
    assert 0.9 < result.claimed_epsilon <= 1.0
    assert result.epsilon_lower <= result.claimed_epsilon


def test_canary_units_need_a_unit_level_run(tmp_path):
    with pytest.raises(ValueError, match="per-unit guarantee.*privacy_unit_column"):
        unit_audit(tmp_path, privacy_unit_column=None)
    with pytest.raises(ValueError, match="privacy_unit_column='patient'"):
        unit_audit(tmp_path, privacy_unit_column="patient")
