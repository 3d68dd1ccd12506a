"""Private LP-FT in one accounted run: a head phase, then LoRA + head from the head phase's model; both phases
compose in one accountant (checked against an independent RDP accountant), and a second phase at learning rate 0
releases the first phase's model."""

import json
from pathlib import Path

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant
from safetensors.torch import load_file
from transformers import DataCollatorWithPadding

from hf_dpmerge import DPSAMTrainer
from hf_dpmerge.data import get_task_spec
from hf_dpmerge.modeling.pooled_features import task_head
from hf_dpmerge.scripts import train as train_glue
from hf_dpmerge.training.dp.accounting import PrivacyAccountant
from hf_dpmerge.training.lora_classifier import lora_sequence_classifier
from tests.utils.tiny_models import save_tiny_bert, tiny_tokenizer
from tests.utils.training_helpers import lora_classifier, text_dataset, trainer_config

RUN = ["--max_train_samples", "64", "--max_eval_samples", "16", "--per_device_train_batch_size", "16",
       "--physical_batch_size", "16", "--max_length", "16", "--max_steps", "3", "--accountant", "rdp",
       "--head_phase_epsilon", "2", "--head_phase_steps", "4", "--head_phase_batch_size", "32", "--dp_seed", "0"]


def independent_rdp_epsilon(phases: list[dict], delta: float) -> float:
    accountant = RdpAccountant()
    for phase in phases:
        event = dp_event.PoissonSampledDpEvent(phase["sample_rate"],
                                               dp_event.GaussianDpEvent(phase["effective_noise_multiplier"]))
        accountant.compose(event, phase["steps"])
    return accountant.get_epsilon(delta)


def lp_ft(tmp_path: Path, monkeypatch, *flags: str) -> tuple[dict, dict, dict]:
    """Run train_glue.py with LP-FT; (record, released weights, the model's head right after the head phase)."""
    after_head = {}
    real_head_phase = train_glue.head_phase

    def recording_head_phase(script, config, base_dir, spec, model, *args):
        phases = real_head_phase(script, config, base_dir, spec, model, *args)
        after_head.update({k: v.clone() for k, v in task_head(model).state_dict().items() if "modules_to_save" in k})
        return phases

    monkeypatch.setattr(train_glue, "head_phase", recording_head_phase)
    train_glue.main(["--model_name_or_path", str(save_tiny_bert(tmp_path / "tiny")), "--runs_dir",
                     str(tmp_path / "runs"), "--task", "bbc_news", *RUN, *flags])
    adapter = tmp_path / "runs" / "bbc_news" / "adapter"
    record = json.loads((adapter / "dp_privacy.json").read_text())
    return record, load_file(str(adapter / "adapter_model.safetensors")), after_head


@pytest.mark.slow
def test_the_phases_compose_in_one_accountant(tmp_path, monkeypatch):
    record, _, _ = lp_ft(tmp_path, monkeypatch, "--target_epsilon", "6")
    head, lora = record["extra"]["phases"]
    assert (head["name"], head["steps"], head["expected_batch_size"]) == ("head", 4, 32)
    assert (lora["name"], lora["steps"], lora["expected_batch_size"]) == ("lora", 3, 16)
    assert PrivacyAccountant("rdp", head["effective_noise_multiplier"], head["sample_rate"],
                             record["delta"]).epsilon_after(4) <= 2.0
    assert record["epsilon"] <= 6.0
    assert record["epsilon"] == pytest.approx(independent_rdp_epsilon([head, lora], record["delta"]), rel=0.01)
    assert record["noise_multiplier"] == lora["noise_multiplier"] and record["steps"] == 3


@pytest.mark.slow
def test_a_second_phase_at_learning_rate_zero_releases_the_head_phase_model(tmp_path, monkeypatch):
    # DPSAMConfig refuses a head rate of 0; at 1e-30 an Adam step (≤ lr per coordinate) leaves float32 weights exact
    _, weights, after_head = lp_ft(tmp_path, monkeypatch, "--learning_rate", "0", "--head_learning_rate", "1e-30",
                                   "--target_epsilon", "6")
    assert all(tensor.abs().sum() == 0 for key, tensor in weights.items() if ".lora_B." in key)
    released = {key.rsplit(".", 1)[-1]: tensor for key, tensor in weights.items() if "classifier" in key}
    assert len(after_head) == len(released) == 2  # the trained head's weight and bias
    for name, tensor in after_head.items():
        torch.testing.assert_close(released[name.rsplit(".", 1)[-1]], tensor, rtol=0, atol=0)


@pytest.mark.slow
def test_a_resumed_run_takes_its_head_phase_from_the_checkpoint(tmp_path, monkeypatch):
    """Resuming the LoRA phase trains no head phase again (the checkpoint holds its head and its record): the
    release is the uninterrupted run's, weights and record; a checkpoint of another head phase is refused."""
    flags = ["--target_epsilon", "6", "--save_strategy", "steps", "--save_steps", "2"]
    record, weights, _ = lp_ft(tmp_path, monkeypatch, *flags)
    trained = []
    real_dp_trainer = train_glue.dp_trainer

    def recording_dp_trainer(model, config, **kwargs):
        trained.append(Path(config.output_dir).name)
        return real_dp_trainer(model, config, **kwargs)

    monkeypatch.setattr(train_glue, "dp_trainer", recording_dp_trainer)
    checkpoint = tmp_path / "runs" / "bbc_news" / "checkpoints" / "checkpoint-2"
    resumed, resumed_weights, _ = lp_ft(tmp_path, monkeypatch, *flags, "--overwrite", "true",
                                        "--resume_from_checkpoint", str(checkpoint))
    assert trained == ["checkpoints"]  # the LoRA phase only
    assert resumed["extra"]["phases"] == record["extra"]["phases"] and resumed["epsilon"] == record["epsilon"]
    assert resumed["resumed_from_steps"] == [2]
    assert resumed_weights.keys() == weights.keys()
    for key, tensor in weights.items():
        torch.testing.assert_close(resumed_weights[key], tensor, rtol=0, atol=0)
    with pytest.raises(ValueError, match="not trained after a head phase of --head_phase_steps 5"):
        lp_ft(tmp_path, monkeypatch, *flags, "--overwrite", "true", "--resume_from_checkpoint", str(checkpoint),
              "--head_phase_steps", "5")


def test_a_head_phase_that_spends_the_whole_budget_is_refused(tmp_path):
    with pytest.raises(ValueError, match="already spend ε = .* of --target_epsilon 1.*--head_phase_epsilon"):
        train_glue.main(["--model_name_or_path", str(save_tiny_bert(tmp_path / "tiny")), "--runs_dir",
                         str(tmp_path / "runs"), "--task", "bbc_news", *RUN, "--target_epsilon", "1"])



def test_a_seeded_later_phase_draws_streams_of_its_own(tmp_path):
    """With dp_seed, the phase after the head phase must not replay the head phase's Poisson draws and noise (the
    composition of the phases needs independent noise)."""
    phase = {"name": "head", "noise_multiplier": 1.0, "effective_noise_multiplier": 1.0, "sample_rate": 0.1,
             "expected_batch_size": 20, "steps": 2}
    trainers = [DPSAMTrainer(model=lora_classifier(), args=trainer_config(tmp_path / str(len(earlier))),
                             train_dataset=text_dataset(), data_collator=DataCollatorWithPadding(tiny_tokenizer()),
                             earlier_phases=earlier) for earlier in ([], [phase])]
    first, later = (t.dp_state for t in trainers)
    for stream, draw in (("sample_generator", torch.rand), ("noise_generator", torch.randn)):
        assert not torch.equal(draw(8, generator=getattr(first, stream)), draw(8, generator=getattr(later, stream)))


def test_the_head_phase_model_trains_the_head_alone(tmp_path):
    """``train_lora=False`` (the head phase, and a head-only release): LoRA is there, frozen at B = 0."""
    base = save_tiny_bert(tmp_path / "base")
    model = lora_sequence_classifier(base, get_task_spec("bbc_news"), r=4, alpha=8,
                                     target_modules=["query", "value", "intermediate.dense"], train_lora=False)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("classifier" in n for n in trainable)
    assert any(".lora_B." in n for n, _ in model.named_parameters())


@pytest.mark.slow
def test_a_non_private_run_is_the_recipes_twin_with_the_same_head_phase_unnoised(tmp_path, monkeypatch):
    """``--dp false`` keeps LP-FT's phases (the non-private twin of the recipe): the head phase trains the head, and
    a second phase at learning rate 0 releases that head; ``--head_phase_share 0`` runs no head phase."""
    heads, configs = [], []
    real_head_phase, real_dp_trainer = train_glue.head_phase, train_glue.dp_trainer

    def recording_head_phase(script, config, base_dir, spec, model, *args):
        before = {k: v.clone() for k, v in task_head(model).state_dict().items() if "modules_to_save" in k}
        phases = real_head_phase(script, config, base_dir, spec, model, *args)
        heads.append((before, {k: v.clone() for k, v in task_head(model).state_dict().items() if k in before},
                      phases))
        return phases

    def recording_dp_trainer(model, config, **kwargs):
        configs.append((Path(config.output_dir).name, config.dp))
        return real_dp_trainer(model, config, **kwargs)

    monkeypatch.setattr(train_glue, "head_phase", recording_head_phase)
    monkeypatch.setattr(train_glue, "dp_trainer", recording_dp_trainer)
    base = str(save_tiny_bert(tmp_path / "tiny"))
    flags = ["--max_train_samples", "64", "--max_eval_samples", "16", "--per_device_train_batch_size", "16",
             "--max_length", "16", "--max_steps", "3", "--head_phase_steps", "4", "--head_phase_batch_size", "32",
             "--learning_rate", "0", "--head_learning_rate", "1e-30", "--dp", "false", "--seed", "0"]
    for share, runs in (("0.75", "runs"), ("0", "runs_one_phase")):
        train_glue.main(["--model_name_or_path", base, "--runs_dir", str(tmp_path / runs), "--task", "bbc_news",
                         *flags, "--head_phase_share", share])
    assert configs == [("checkpoints-head", False), ("checkpoints", False), ("checkpoints", False)]
    (before, after, phases), _ = heads
    assert phases == [] and not any(torch.equal(before[k], after[k]) for k in before)  # trained, nothing accounted
    weights = load_file(str(tmp_path / "runs" / "bbc_news" / "adapter" / "adapter_model.safetensors"))
    released = {key.rsplit(".", 1)[-1]: tensor for key, tensor in weights.items() if "classifier" in key}
    for name, tensor in after.items():
        torch.testing.assert_close(released[name.rsplit(".", 1)[-1]], tensor, rtol=0, atol=0)
