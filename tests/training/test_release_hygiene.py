"""Releases leak nothing beyond ε: seeds, the release allow-list, model selection and unsafe combinations.

Each test here failed before the fix it checks (docs/privacy.md, "What a release holds").
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import datasets
import pytest
import torch
from huggingface_hub import ModelCard
from transformers import AutoTokenizer, DataCollatorWithPadding, EarlyStoppingCallback

from hf_dpmerge import DPSAMConfig, DPSAMTrainer, PrivacyRecord
from hf_dpmerge.hub.model_card import build_model_card
from hf_dpmerge.records.release_files import is_release_file
from hf_dpmerge.records.statement_prose import number
from hf_dpmerge.training.dp.run_streams import dataset_identity
from tests.utils.tiny_models import CORPUS, tiny_tokenizer
from tests.utils.training_helpers import lora_classifier, make_trainer, text_dataset


def _files(directory: Path) -> set[str]:
    return {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()}


def _second_task() -> datasets.Dataset:
    """Another binary task with the same shapes as text_dataset(): other texts, other labels."""
    tok = tiny_tokenizer()
    texts = list(reversed(CORPUS)) * 25
    ds = datasets.Dataset.from_dict({"text": texts, "label": [int(i % 3 == 0) for i in range(len(texts))]})
    return ds.map(lambda batch: tok(batch["text"]), batched=True)


def _noise(trainer) -> torch.Tensor:
    """The noise of the trainer's next privatised query (nothing accumulated: noise / B_exp only)."""
    return torch.cat([g.flatten() for g in trainer.privatizer.release()])


def _first_draws(trainer, count: int = 3) -> list[list[int]]:
    sampler = iter(trainer.get_train_dataloader().batch_sampler)
    return [list(next(sampler)) for _ in range(count)]


# ---------------------------------------------------------------------------------------------- 1. seeds


def test_one_dp_seed_on_two_tasks_draws_independent_noise_and_masks(tmp_path):
    first = make_trainer(tmp_path / "a", dp_seed=0)
    second = make_trainer(tmp_path / "b", dataset=_second_task(), dp_seed=0)
    assert [p.shape for p in first._params] == [p.shape for p in second._params]
    a, b = _noise(first), _noise(second)
    assert not torch.equal(a, b)
    correlation = torch.corrcoef(torch.stack([a, b]))[0, 1].item()
    assert abs(correlation) < 5 / a.numel() ** 0.5, correlation  # 5 standard errors of an independent pair
    assert _first_draws(first) != _first_draws(second)


def test_one_dp_seed_on_one_dataset_reproduces_every_draw(tmp_path):
    first, second = make_trainer(tmp_path / "a", dp_seed=3), make_trainer(tmp_path / "b", dp_seed=3)
    assert torch.equal(_noise(first), _noise(second))
    assert _first_draws(first) == _first_draws(second)


def _tokenized_with_tokenizer_saved_at(folder: Path, labels: list[int]) -> datasets.Dataset:
    """text_dataset()'s texts, tokenized as training does by the tiny tokenizer saved to and loaded from ``folder``."""
    tiny_tokenizer().save_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    texts = CORPUS * 25
    return datasets.Dataset.from_dict({"text": texts, "label": labels}).map(lambda b: tok(b["text"]), batched=True)


def test_a_seeded_run_draws_the_same_noise_wherever_its_tokenizer_was_saved(tmp_path):
    labels = [i % 2 for i in range(len(CORPUS) * 25)]
    here = _tokenized_with_tokenizer_saved_at(tmp_path / "runs_a" / "base", labels)
    there = _tokenized_with_tokenizer_saved_at(tmp_path / "elsewhere" / "runs_b" / "base", labels)
    assert here._fingerprint != there._fingerprint  # datasets hashes the tokenizer's folder into its fingerprint
    assert dataset_identity(here) == dataset_identity(there) == dataset_identity(here.with_format("torch"))
    first, second = make_trainer(tmp_path / "a", dataset=here, dp_seed=5), make_trainer(tmp_path / "b", dataset=there,
                                                                                      dp_seed=5)
    assert torch.equal(_noise(first), _noise(second))
    assert _first_draws(first) == _first_draws(second)
    relabelled = _tokenized_with_tokenizer_saved_at(tmp_path / "runs_c" / "base", [1 - y for y in labels])
    assert dataset_identity(relabelled) != dataset_identity(here)  # other data (labels only): another identity


def test_dataset_identity_of_a_torch_dataset_follows_its_rows():
    rows = [{"input_ids": torch.tensor([1, 2, 3]), "label": 0}, {"input_ids": torch.tensor([4, 5]), "label": 1}]
    changed = [rows[0], {"input_ids": torch.tensor([4, 6]), "label": 1}]
    assert dataset_identity(rows) == dataset_identity(list(rows))
    assert dataset_identity(rows) != dataset_identity(changed)


def _record_after_one_step(trainer) -> PrivacyRecord:
    trainer.accountant.step()  # a record needs ε > 0
    return trainer.privacy_record()


def test_the_record_says_whether_the_run_was_seeded(tmp_path):
    assert _record_after_one_step(make_trainer(tmp_path / "a", dp_seed=0)).seeded is True
    assert _record_after_one_step(make_trainer(tmp_path / "b", dp_seed=None)).seeded is False


# ---------------------------------------------------------------------------------------------- 2. push path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A seeded private run of two steps that logged its loss and wrote a checkpoint."""
    trainer = make_trainer(tmp_path_factory.mktemp("run"), max_steps=2, logging_steps=1, save_strategy="steps",
                           save_steps=1, hub_model_id="alice/dp-adapter")
    trainer.train()
    assert any("loss" in entry for entry in trainer.state.log_history)
    return trainer


def test_save_model_writes_only_allow_listed_files(trained, tmp_path):
    trained.save_model(str(tmp_path / "adapter"))
    files = _files(tmp_path / "adapter")
    assert {"adapter_model.safetensors", "adapter_config.json", "dp_privacy.json"} <= files
    assert "training_args.bin" not in files
    assert all(is_release_file(f) for f in files), files


def test_released_files_take_the_users_umask_and_plain_values(trained, tmp_path):
    """Not mkstemp's 0600: others on the machine (or a Hub upload tool run by another user) read a release."""
    previous = os.umask(0o027)
    try:
        trained.save_model(str(tmp_path / "adapter"))
    finally:
        os.umask(previous)
    modes = {f: stat.S_IMODE((tmp_path / "adapter" / f).stat().st_mode) for f in _files(tmp_path / "adapter")}
    assert modes and all(mode == 0o640 for mode in modes.values()), modes
    record = json.loads((tmp_path / "adapter" / "dp_privacy.json").read_text())
    assert record["optimizer"]["lr_scheduler"] == "linear"  # the plain value, not "SchedulerType.LINEAR"


def test_the_adapter_folder_card_states_the_record_not_pefts_template(trained, tmp_path):
    """save_model's README.md is the adapter card of the record (peft's blank template replaced)."""
    trained.save_model(str(tmp_path / "adapter"))
    card = ModelCard.load(tmp_path / "adapter" / "README.md")
    record = PrivacyRecord.load(tmp_path / "adapter")
    assert "[More Information Needed]" not in card.content and card.data.library_name == "peft"
    text = card.text
    assert f"(ε = {number(record.epsilon)}, δ = {number(record.delta)})-DP" in text
    assert f"ε = {number(record.epsilon_replace_one)} for replace-one" in text
    assert (f"by the {record.accountant} accountant over {record.steps} DP-SGD steps with effective noise "
            f"multiplier σ = {record.effective_noise_multiplier:.4g} and sampling rate q = {record.sample_rate:.4g} "
            f"on {record.num_units} units") in text
    assert "The privacy unit is one training example (row)" in text
    assert record.seeded and "**Seeded training: `dp-adapter`.**" in text


def test_push_to_hub_uploads_the_release_only(trained, loopback_hub):
    with pytest.raises(ValueError, match=r"fixed dp_seed.*allow_seeded=True"):
        trained.push_to_hub()
    assert loopback_hub.repos == {}

    trained.push_to_hub(allow_seeded=True)
    repo = loopback_hub.repos["alice/dp-adapter"]
    assert len(repo.commits) == 1
    files = set(repo.files)
    assert {"adapter_model.safetensors", "adapter_config.json", "dp_privacy.json", "README.md"} <= files
    assert all(is_release_file(f) for f in files), files
    assert not {"training_args.bin", "trainer_state.json"} & files
    assert not [f for f in files if f.startswith("checkpoint-")]
    card = repo.files["README.md"].decode()
    assert "Training Loss" not in card and "can regenerate" in card
    record = PrivacyRecord.from_dict(json.loads(repo.files["dp_privacy.json"]))
    assert f"(ε = {number(record.epsilon)}, δ = {number(record.delta)})-DP" in card  # the same statement as on disk
    assert json.loads(repo.files["dp_privacy.json"])["seeded"] is True


def test_push_names_the_public_base_or_pushes_the_base_alongside(tmp_path, loopback_hub):
    """A pushed adapter names its base by a Hub id: the public one it came from (a stock class computes it), else
    its own repository, which then holds the base (config.json and weights) beside the adapter."""
    trained = make_trainer(tmp_path, max_steps=1, hub_model_id="alice/dp-adapter")
    trained.train()
    trained.push_to_hub(allow_seeded=True)
    files = loopback_hub.repos["alice/dp-adapter"].files
    assert json.loads(files["adapter_config.json"])["base_model_name_or_path"] == "alice/dp-adapter"
    assert {"config.json", "model.safetensors"} <= set(files)
    config = trained.model.peft_config["default"]
    config.base_model_name_or_path = "org/public-base"
    try:
        trained.push_to_hub(allow_seeded=True)
    finally:
        config.base_model_name_or_path = None
    repo = loopback_hub.repos["alice/dp-adapter"]
    assert json.loads(repo.files["adapter_config.json"])["base_model_name_or_path"] == "org/public-base"
    assert not {"config.json", "model.safetensors"} & set(repo.commits[-1]["files"])


def test_push_during_training_is_refused_under_dp():
    for strategy in ("checkpoint", "all_checkpoints", "every_save"):
        with pytest.raises(ValueError, match=f"hub_strategy='{strategy}'"):
            DPSAMConfig(output_dir="out", use_cpu=True, report_to="none", push_to_hub=True, hub_strategy=strategy)


# ---------------------------------------------------------------------------------------------- 4. model selection


@pytest.mark.parametrize("flags", [dict(eval_strategy="steps"),
                                   dict(eval_strategy="steps", save_strategy="steps", load_best_model_at_end=True)])
def test_evaluation_during_training_on_private_data_is_refused(flags):
    with pytest.raises(ValueError, match="eval_data_is_public=True"):
        DPSAMConfig(output_dir="out", use_cpu=True, report_to="none", **flags)


def test_early_stopping_is_refused_unless_the_evaluation_data_is_public(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=1)
    trainer.add_callback(EarlyStoppingCallback(early_stopping_patience=1))
    with pytest.raises(ValueError, match="EarlyStoppingCallback.*eval_data_is_public=True"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_public_evaluation_data_is_recorded_and_stated(tmp_path):
    args = DPSAMConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", accountant="rdp",
                       per_device_train_batch_size=20, eval_strategy="steps", eval_steps=2, eval_data_is_public=True)
    trainer = DPSAMTrainer(model=lora_classifier(), args=args, train_dataset=text_dataset(),
                           eval_dataset=text_dataset(2), data_collator=DataCollatorWithPadding(tiny_tokenizer()))
    record = _record_after_one_step(trainer)
    assert record.eval_data_is_public is True
    assert "declared public" in build_model_card({"alpha": record}).text


# ---------------------------------------------------------------------------------------------- 5. combinations


@pytest.mark.parametrize("flag", ["fp16", "bf16"])
def test_mixed_precision_is_refused_under_dp(flag):
    with pytest.raises(ValueError, match="--fp16 false --bf16 false"):
        DPSAMConfig(output_dir="out", use_cpu=True, report_to="none", **{flag: True})


def test_gradient_checkpointing_is_refused_naming_per_sample_gradients(tmp_path):
    with pytest.raises(ValueError, match="per-sample gradients"):
        DPSAMConfig(output_dir="out", use_cpu=True, report_to="none", activation_checkpointing=True)
    model = lora_classifier()
    model.base_model.model.bert.gradient_checkpointing = True  # what gradient_checkpointing_enable() sets
    with pytest.raises(ValueError, match="gradient checkpointing.*per-sample"):
        make_trainer(tmp_path, model=model)


def test_half_precision_trainable_weights_are_refused_under_dp(tmp_path):
    with pytest.raises(ValueError, match=r"trainable parameters are bfloat16 \(.*lora_A.*torch_dtype=torch.float32"):
        make_trainer(tmp_path, model=lora_classifier().to(torch.bfloat16))
    with pytest.raises(ValueError, match="float16"):
        make_trainer(tmp_path, model=lora_classifier().to(torch.float16))
    half_base = lora_classifier()
    for param in half_base.parameters():  # a half-precision frozen base with float32 adapters is fine
        if not param.requires_grad:
            param.data = param.data.to(torch.bfloat16)
    assert all(p.dtype == torch.float32 for p in make_trainer(tmp_path, model=half_base)._params)
    make_trainer(tmp_path, model=lora_classifier().to(torch.bfloat16), dp=False)  # the stock Trainer allows it


def test_hyperparameter_search_is_refused_under_dp_before_any_trial(tmp_path):
    trainer = DPSAMTrainer(
        model=None, model_init=lambda trial=None: lora_classifier(),
        args=DPSAMConfig(output_dir=str(tmp_path), per_device_train_batch_size=20, max_steps=1, use_cpu=True,
                         report_to="none", target_epsilon=4.0, disable_tqdm=True),
        train_dataset=text_dataset(), data_collator=DataCollatorWithPadding(tiny_tokenizer()),
    )
    with pytest.raises(ValueError, match="hyperparameter_search is refused under DP.*hf-dpmerge tune"):
        trainer.hyperparameter_search(n_trials=2, direction="maximize")
    assert not any(tmp_path.iterdir())  # no trial ran
    non_private = make_trainer(tmp_path, dp=False)  # without model_init: Trainer's own refusal, unchanged
    with pytest.raises(RuntimeError, match="model_init"):
        non_private.hyperparameter_search(n_trials=1)


def test_an_iterable_dataset_is_refused_naming_the_size_n(tmp_path):
    streamed = text_dataset().to_iterable_dataset()
    with pytest.raises(TypeError, match=r"size N \(sample rate q = B_exp/N\)"):
        make_trainer(tmp_path, dataset=streamed)


@pytest.mark.slow
def test_resume_mid_epoch_with_dropout_gives_the_uninterrupted_weights(tmp_path, lora_model):
    # N = 200, B = 20: 10 steps per epoch, so checkpoint-3 is mid-epoch
    settings = dict(max_steps=6, save_strategy="steps", save_steps=3)
    full = make_trainer(tmp_path / "full", model=lora_model(dropout=0.2, lora_dropout=0.1), **settings)
    full.train()
    checkpoint = tmp_path / "resumed" / "out" / "checkpoint-3"
    shutil.copytree(tmp_path / "full" / "out" / "checkpoint-3", checkpoint)
    resumed = make_trainer(tmp_path / "resumed", model=lora_model(dropout=0.2, lora_dropout=0.1), **settings)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    expected = dict(full.model.named_parameters())
    for name, param in resumed.model.named_parameters():
        if param.requires_grad:
            torch.testing.assert_close(param, expected[name], rtol=1e-5, atol=1e-6)
    assert resumed.accountant.steps == full.accountant.steps == 6
