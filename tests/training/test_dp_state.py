"""The trainer's DPState: its checkpoint file (format kept from the first release), budget, callback, and what a
resume draws (fresh streams without dp_seed, the uninterrupted run's with it) and records."""

from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback, TrainerControl, TrainerState

from hf_dpmerge.records.record import PrivacyRecord
from hf_dpmerge.training.dp.accounting import PrivacyAccountant, PrivacyBudgetExhausted
from hf_dpmerge.training.dp.state import DP_STATE_NAME, DPState, DPStateCallback, seeded_generator
from tests.utils.records import privacy_record
from tests.utils.training_helpers import make_trainer

# the keys of dp_state.pt as the first release's ``save_dp_state`` wrote them (one torch.save'd dict)
ORIGINAL_KEYS = {"accountant", "previous_gradient", "sum_lr_squared", "sample_generator", "noise_generator"}
RESUME_SETTINGS = dict(max_steps=6, save_strategy="steps", save_steps=3, sam_mode="dp_sat", sam_rho=0.1)


def _dp_state(steps: int = 0, allowed_steps: int = 5) -> DPState:
    state = DPState(seeded_generator(1), seeded_generator(2), PrivacyAccountant("rdp", 1.0, 0.1, 1e-5), allowed_steps)
    for _ in range(steps):
        state.record_step(0.1)
    return state


def test_save_and_load_continue_every_field(tmp_path):
    saved = _dp_state(steps=3)
    saved.previous_gradient = [torch.randn(3, 2)]
    path = saved.save(tmp_path)
    assert path == tmp_path / DP_STATE_NAME and set(torch.load(path, weights_only=False)) == ORIGINAL_KEYS

    loaded = _dp_state()
    loaded.load(path)
    assert loaded.accountant.history == saved.accountant.history and loaded.accountant.steps == 3
    assert loaded.sum_lr_squared == pytest.approx(3 * 0.1**2)
    torch.testing.assert_close(loaded.previous_gradient, saved.previous_gradient)
    for generator in ("sample_generator", "noise_generator"):
        assert torch.equal(torch.rand(4, generator=getattr(loaded, generator)),
                           torch.rand(4, generator=getattr(saved, generator)))


def test_load_refuses_a_checkpoint_that_disagrees_on_dp(tmp_path):
    path = DPState(seeded_generator(1), seeded_generator(2)).save(tmp_path)  # a non-private run's
    with pytest.raises(ValueError, match=f"{path}: checkpoint and run disagree on whether training is private"):
        _dp_state().load(path)


def test_resume_at_another_batch_size_names_the_batch_size(tmp_path):
    """A larger expected batch changes q and, at the same target ε, the calibrated σ: the message names the batch."""
    path = _dp_state(steps=2).save(tmp_path)
    other = DPState(seeded_generator(1), seeded_generator(2), PrivacyAccountant("rdp", 1.3, 0.2, 1e-5), 5)
    with pytest.raises(ValueError, match=r"sample_rate=0.1 but this run uses 0.2; q = expected batch / N: resume "
                                         r"with the same --per_device_train_batch_size"):
        other.load(path)


def test_budget_refuses_the_step_after_the_allowed_ones():
    state = _dp_state(steps=2, allowed_steps=3)
    state.check_budget()
    state.record_step(0.1)
    assert state.budget_spent
    with pytest.raises(PrivacyBudgetExhausted, match="ε budget spent after 3 steps"):
        state.check_budget()
    non_private = DPState(seeded_generator(1), seeded_generator(2))
    non_private.record_step(0.1)
    assert not non_private.budget_spent and non_private.sum_lr_squared == pytest.approx(0.01)


def test_callback_restores_rng_once_and_stops_at_the_budget():
    state = _dp_state(steps=1, allowed_steps=2)
    state.rng_checkpoint = Path("out/checkpoint-3")
    restored, logged = [], []
    callback = DPStateCallback(state, restored.append, logged.append)
    trainer_state, control = TrainerState(global_step=1, max_steps=10), TrainerControl()
    for _ in range(2):
        callback.on_step_begin(None, trainer_state, control)
    assert restored == ["out/checkpoint-3"] and state.rng_checkpoint is None

    callback.on_step_end(None, trainer_state, control)
    assert not control.should_training_stop and logged == []
    state.record_step(0.1)
    callback.on_step_end(None, trainer_state, control)
    assert control.should_training_stop and logged == [{"dp_budget_exhausted": 1.0}]


class _WriteOriginalFormat(TrainerCallback):
    """Replaces the step-3 checkpoint's ``dp_state.pt`` by the file the first release wrote: ``torch.save`` of a
    plain dict with its five keys, filled from the trainer's public attributes at that step."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == 3:
            trainer = self.trainer
            original = {
                "accountant": trainer.accountant.state_dict(),
                "previous_gradient": [g.clone() for g in trainer.dp_state.previous_gradient],
                "sum_lr_squared": trainer.sum_lr_squared,
                "sample_generator": trainer.sample_generator.get_state(),
                "noise_generator": trainer.dp_state.noise_generator.get_state(),
            }
            assert set(original) == ORIGINAL_KEYS
            torch.save(original, Path(args.output_dir) / "checkpoint-3" / DP_STATE_NAME)


@pytest.mark.parametrize("checkpoint_format", ["current", "original"])
def test_resume_continues_epsilon_and_matches_an_uninterrupted_run(tmp_path, checkpoint_format):
    full = make_trainer(tmp_path / "full", **RESUME_SETTINGS)
    full.train()
    interrupted = make_trainer(tmp_path / "part", **RESUME_SETTINGS)
    if checkpoint_format == "original":
        interrupted.add_callback(_WriteOriginalFormat(interrupted))
    interrupted.train()

    resumed = make_trainer(tmp_path / "part", **RESUME_SETTINGS)
    resumed.train(resume_from_checkpoint=str(tmp_path / "part" / "out" / "checkpoint-3"))
    assert resumed.accountant.steps == 6
    assert resumed.accountant.epsilon() == pytest.approx(full.accountant.epsilon(), rel=1e-12)
    assert resumed.sum_lr_squared == pytest.approx(full.sum_lr_squared)
    for a, b in zip(resumed._params, full._params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------- what a resume draws


def _noise_spy(monkeypatch) -> list[torch.Tensor]:
    """The Gaussian noise vectors the privatiser draws (``torch.normal`` with a generator), in order."""
    drawn, normal = [], torch.normal

    def spy(*args, **kwargs):
        noise = normal(*args, **kwargs)
        if kwargs.get("generator") is not None:
            drawn.append(noise.detach().flatten().clone())
        return noise

    monkeypatch.setattr(torch, "normal", spy)
    return drawn


def _run(trainer, drawn: list[torch.Tensor], **train_kwargs) -> torch.Tensor:
    """Train; the noise drawn meanwhile, as one vector."""
    drawn.clear()
    trainer.train(**train_kwargs)
    return torch.cat(drawn)


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.dot(a, b) / (a.norm() * b.norm()))


def test_unseeded_resumes_from_one_checkpoint_draw_fresh_noise_and_record_the_step(tmp_path, monkeypatch):
    drawn = _noise_spy(monkeypatch)
    settings = {**RESUME_SETTINGS, "dp_seed": None}
    original = make_trainer(tmp_path / "original", **settings)
    after_checkpoint = _run(original, drawn).chunk(2)[1]  # steps 4-6, drawn after checkpoint-3
    checkpoint = str(tmp_path / "original" / "out" / "checkpoint-3")

    branches, noise = [], []
    for learning_rate in (1e-2, 3e-3):  # two releases branched from one checkpoint
        branches.append(make_trainer(tmp_path / f"lr{learning_rate}", learning_rate=learning_rate, **settings))
        noise.append(_run(branches[-1], drawn, resume_from_checkpoint=checkpoint))
    first, second = noise
    assert first.shape == second.shape == after_checkpoint.shape
    # independent N(0, σ²C²) vectors of this dimension have |cosine| ≈ 1/√d; shared noise has cosine 1
    bound = 8 / first.numel() ** 0.5
    assert bound < 0.2
    for a, b in ((first, second), (first, after_checkpoint), (second, after_checkpoint)):
        assert abs(_cosine(a, b)) < bound
    for branch in branches:
        assert branch.accountant.steps == 6
        assert branch.accountant.epsilon() == pytest.approx(original.accountant.epsilon(), rel=1e-12)
        record = branch.privacy_record()
        assert record.resumed_from_steps == [3] and record.seeded is False and record.steps == 6
        assert PrivacyRecord.from_dict(record.to_dict()).resumed_from_steps == [3]
    assert original.privacy_record().resumed_from_steps == []


def test_seeded_resume_draws_the_uninterrupted_runs_noise(tmp_path, monkeypatch):
    drawn = _noise_spy(monkeypatch)
    original = make_trainer(tmp_path / "original", **RESUME_SETTINGS)  # dp_seed=0
    after_checkpoint = _run(original, drawn).chunk(2)[1]
    resumed = make_trainer(tmp_path / "resumed", **RESUME_SETTINGS)
    noise = _run(resumed, drawn, resume_from_checkpoint=str(tmp_path / "original" / "out" / "checkpoint-3"))
    assert torch.equal(noise, after_checkpoint)
    assert torch.equal(resumed.sample_generator.get_state(), original.sample_generator.get_state())
    record = resumed.privacy_record()
    assert record.seeded is True and record.resumed_from_steps == [3]


def _checkpoint(directory: Path, step: int, record: PrivacyRecord | None) -> Path:
    """A complete checkpoint of ``step`` (DP state, Trainer state) holding ``record`` when given."""
    directory.mkdir(parents=True)
    _dp_state(steps=step, allowed_steps=10).save(directory)
    TrainerState(global_step=step).save_to_json(str(directory / "trainer_state.json"))
    if record is not None:
        record.save(directory)
    return directory


@pytest.mark.parametrize("seeded", [True, False])
def test_resume_records_every_resume_step_and_keeps_earlier_seeding(tmp_path, seeded):
    earlier = privacy_record("t", steps=4, resumed_from_steps=[2], seeded=seeded)
    checkpoint = _checkpoint(tmp_path / "checkpoint-4", 4, earlier)
    state = _dp_state(allowed_steps=10)
    state.resume(checkpoint, fresh_sample_seed=None)
    assert state.resumed_from_steps == [2, 4] and state.seeded_before_resume is seeded
    assert state.accountant.steps == 4


def test_resume_without_a_record_leaves_earlier_seeding_unknown_and_fresh_streams_differ(tmp_path):
    checkpoint = _checkpoint(tmp_path / "checkpoint-3", 3, None)
    saved = _dp_state()
    continued, fresh = _dp_state(allowed_steps=10), _dp_state(allowed_steps=10)
    continued.resume(checkpoint, fresh_sample_seed=None)
    fresh.resume(checkpoint, fresh_sample_seed=12345)
    assert fresh.resumed_from_steps == continued.resumed_from_steps == [3] and fresh.seeded_before_resume is None
    for name in ("sample_generator", "noise_generator"):
        expected = torch.rand(4, generator=getattr(saved, name))
        assert torch.equal(torch.rand(4, generator=getattr(continued, name)), expected)
        assert not torch.equal(torch.rand(4, generator=getattr(fresh, name)), expected)


def test_records_written_before_resumes_were_recorded_load_as_never_resumed():
    data = privacy_record("t").to_dict()
    del data["resumed_from_steps"]
    assert PrivacyRecord.from_dict(data).resumed_from_steps == []
    with pytest.raises(ValueError, match="resumed_from_steps"):
        privacy_record("t", steps=4, resumed_from_steps=[5])
