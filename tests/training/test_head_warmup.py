"""Head first, then LoRA, in one accounted run (head_warmup_steps)."""

import pytest
import torch
from opacus.accountants import create_accountant

from hf_dpmerge import DPSAMConfig
from hf_dpmerge.training.dp.privatizer import GradientPrivatizer
from tests.utils.training_helpers import make_trainer

WARMUP, STEPS = 2, 5


def test_lora_is_frozen_and_unnoised_for_k_steps_then_trains_under_one_accountant(tmp_path, monkeypatch):
    trainer = make_trainer(tmp_path, max_steps=STEPS, head_warmup_steps=WARMUP, noise_multiplier=1.0,
                           target_epsilon=None, logging_steps=STEPS, lr_scheduler_type="constant")
    names = trainer._param_names
    lora = [i for i, n in enumerate(names) if ".lora_" in n]
    head = [i for i, n in enumerate(names) if ".modules_to_save." in n]
    snapshots, clipped = [], []  # parameters before each step; which parameters each step clipped and noised
    accumulate = GradientPrivatizer.accumulate

    name_of = {id(p): n for n, p in zip(names, trainer._params)}

    def recording(self, grads):
        clipped[-1].update(name_of[id(p)] for p in self.params)
        return accumulate(self, grads)

    monkeypatch.setattr(GradientPrivatizer, "accumulate", recording)
    original_step = trainer.training_step

    def step(*args, **kwargs):
        snapshots.append([p.detach().clone() for p in trainer._params])
        clipped.append(set())
        return original_step(*args, **kwargs)

    trainer.training_step = step
    trainer.train()
    snapshots.append([p.detach().clone() for p in trainer._params])
    for t in range(STEPS):
        lora_moved = any(not torch.equal(snapshots[t][i], snapshots[t + 1][i]) for i in lora)
        head_moved = all(not torch.equal(snapshots[t][i], snapshots[t + 1][i]) for i in head)
        assert head_moved and lora_moved == (t >= WARMUP), t
        assert clipped[t] == ({names[i] for i in head} if t < WARMUP else set(names)), t
    accountant = create_accountant("rdp")
    accountant.history = [(1.0, trainer.sample_rate, STEPS)]
    assert trainer.accountant.steps == STEPS
    assert trainer.privacy_record().epsilon == pytest.approx(accountant.get_epsilon(trainer.delta), rel=1e-9)
    assert trainer.privacy_record().extra["head_warmup_steps"] == WARMUP
    assert trainer.sum_lr_squared == pytest.approx((STEPS - WARMUP) * 1e-2**2)  # the encoder's noisy steps


def test_sigma_is_calibrated_for_all_steps_warmup_included(tmp_path):
    plain = make_trainer(tmp_path / "plain", max_steps=STEPS)
    warm = make_trainer(tmp_path / "warm", max_steps=STEPS, head_warmup_steps=WARMUP)
    assert warm.noise_multiplier == plain.noise_multiplier and warm.planned_steps == STEPS


@pytest.mark.parametrize("value", [-1, 1.5, float("nan"), float("inf")])
def test_a_warmup_that_is_neither_a_step_count_nor_a_fraction_is_refused(tmp_path, value):
    with pytest.raises(ValueError, match="head_warmup_steps must be an integer ≥ 1 .* or a fraction in"):
        DPSAMConfig(output_dir=str(tmp_path), head_warmup_steps=value, use_cpu=True, report_to="none")


@pytest.mark.parametrize(("value", "total", "expected"),
                         [(0.25, 40, 10), (0.25, 5, 1), (0.25, 3, 0), (0.99, 1, 0), (0.0, 40, 0), (3, 40, 3)])
def test_a_fractional_warmup_is_that_share_of_the_steps_rounded_down(tmp_path, value, total, expected):
    config = DPSAMConfig(output_dir=str(tmp_path), head_warmup_steps=value, use_cpu=True, report_to="none")
    assert config.head_warmup_step_count(total) == expected


def test_a_fractional_warmup_trains_the_head_alone_for_its_share_and_records_the_count(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=STEPS, head_warmup_steps=0.5, noise_multiplier=1.0,
                           target_epsilon=None, logging_steps=STEPS, lr_scheduler_type="constant")
    lora_before = [p.detach().clone() for n, p in zip(trainer._param_names, trainer._params) if ".lora_" in n]
    trainer.train()
    assert trainer.privacy_record().extra["head_warmup_steps"] == STEPS // 2
    assert trainer.sum_lr_squared == pytest.approx((STEPS - STEPS // 2) * 1e-2**2)  # LoRA's noisy steps only
    lora_after = [p for n, p in zip(trainer._param_names, trainer._params) if ".lora_" in n]
    assert any(not torch.equal(a, b) for a, b in zip(lora_before, lora_after))


def test_the_noise_statistics_of_a_warm_started_run_count_each_groups_own_steps(tmp_path):
    """The release ships dp_noise_stats with a warm-up too: the LoRA group's learning rates are its T − K noisy
    steps (whose Σ η² the record holds), the head's all T (without this the statistics were dropped and merges
    fell back to the record's over-stating formula)."""
    from hf_dpmerge.noise.collection import collect_noise_stats

    trainer = make_trainer(tmp_path, max_steps=STEPS, head_warmup_steps=WARMUP, noise_multiplier=1.0,
                           target_epsilon=None, logging_steps=STEPS, lr_scheduler_type="constant")
    trainer.train()
    stats = collect_noise_stats(trainer)
    assert stats is not None
    heads = [i for i, g in enumerate(trainer.optimizer.param_groups)
             if all(id(p) in {id(q) for q, h in zip(trainer._params, trainer._is_head) if h} for p in g["params"])]
    lengths = {int(group): len(lrs) for group, lrs in stats.lrs.items()}
    assert heads and all(lengths[i] == STEPS for i in heads)
    assert all(length == STEPS - WARMUP for i, length in lengths.items() if i not in heads)
    assert float(stats.lrs["0"].square().sum()) == pytest.approx(trainer.sum_lr_squared)
