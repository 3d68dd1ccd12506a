"""Iterate averaging (average_last_steps): the release is the mean of the last K iterates, at the same ε."""

import pytest
import torch
from transformers import TrainerCallback

from hf_dpmerge import DPSAMConfig
from tests.utils.training_helpers import make_trainer

STEPS, K = 5, 3


def iterates(trainer) -> list[list[torch.Tensor]]:
    """The trainable parameters after each step, recorded as the run goes (before the averaging callback)."""
    seen: list[list[torch.Tensor]] = []

    class Record(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append([p.detach().clone() for p in trainer._params])

    trainer.callback_handler.callbacks.insert(0, Record())
    return seen


def test_the_release_is_the_mean_of_the_last_k_iterates_at_the_same_epsilon(tmp_path):
    plain = make_trainer(tmp_path / "plain", max_steps=STEPS)
    averaged = make_trainer(tmp_path / "avg", max_steps=STEPS, average_last_steps=K)
    seen = iterates(averaged)
    plain.train()
    averaged.train()
    assert len(seen) == STEPS
    for i, p in enumerate(averaged._params):  # brute force: the mean of the recorded iterates after step T − K
        assert torch.allclose(p, torch.stack([s[i] for s in seen[STEPS - K:]]).mean(0), atol=1e-7)
    assert any(not torch.equal(p, seen[-1][i]) for i, p in enumerate(averaged._params))  # not the last iterate
    for a, b in zip(seen[-1], plain._params, strict=True):  # same seeds: the same run until the release
        assert torch.equal(a, b)
    record = averaged.privacy_record()
    assert record.epsilon == plain.privacy_record().epsilon  # post-processing: no privacy cost
    assert record.extra["iterate_average"] == {"last_steps": K, "iterates": K}
    assert "iterate_average" not in plain.privacy_record().extra


def test_one_iterate_is_the_last_one(tmp_path):
    plain = make_trainer(tmp_path / "plain", max_steps=STEPS)
    one = make_trainer(tmp_path / "one", max_steps=STEPS, average_last_steps=1)
    plain.train()
    one.train()
    for a, b in zip(one._params, plain._params, strict=True):
        assert torch.equal(a, b)


def test_a_resume_inside_the_window_is_refused_and_one_before_it_averages_the_window(tmp_path):
    full = make_trainer(tmp_path / "full", max_steps=STEPS, average_last_steps=K, save_strategy="steps",
                        save_steps=1)
    full.train()
    late = make_trainer(tmp_path / "full", max_steps=STEPS, average_last_steps=K)
    with pytest.raises(ValueError, match="inside the iterate-averaging window .* --average_last_steps 0"):
        late.train(resume_from_checkpoint=str(tmp_path / "full" / "out" / f"checkpoint-{STEPS - 1}"))
    early = make_trainer(tmp_path / "full", max_steps=STEPS, average_last_steps=K)
    early.train(resume_from_checkpoint=str(tmp_path / "full" / "out" / f"checkpoint-{STEPS - K}"))
    assert early.iterate_average.count == K
    for a, b in zip(early._params, full._params, strict=True):  # dp_seed: the resumed run is the uninterrupted one
        assert torch.allclose(a, b, atol=1e-6)


def test_a_negative_window_is_refused(tmp_path):
    with pytest.raises(ValueError, match="average_last_steps must be ≥ 0"):
        DPSAMConfig(output_dir=str(tmp_path), average_last_steps=-1, use_cpu=True, report_to="none")
