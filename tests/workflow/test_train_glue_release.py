"""examples/train_glue.py honours or refuses the flags its --help shows, and releases adapters that stock
transformers/peft load as the function hf_dpmerge trained."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from peft import PeftModel

from hf_dpmerge.data import get_task_spec
from hf_dpmerge.modeling import load_sequence_classifier
from hf_dpmerge.scripts import train as train_glue  # what examples/train_glue.py runs
from hf_dpmerge.training.dpsam_config import DPSAMConfig
from hf_dpmerge.training.dpsam_trainer import DPSAMTrainer
from tests.utils.stock_loading import TEXTS, load_without_hf_dpmerge
from tests.utils.tiny_models import save_tiny_bert, tiny_tokenizer

TINY_RUN = ["--max_steps", "2", "--max_train_samples", "64", "--max_eval_samples", "32",
            "--per_device_train_batch_size", "16", "--physical_batch_size", "16", "--max_length", "16",
            "--target_epsilon", "8", "--logging_steps", "1", "--head_phase_steps", "2", "--head_phase_batch_size", "16"]


# (argv, the flag the error must name): flags meaningless for the script, whatever --dp says
SCRIPT_REFUSED = [
    (["--output_dir", "somewhere"], "--output_dir"), (["--push_to_hub"], "--push_to_hub"),
    (["--hub_model_id=me/x"], "--hub_model_id"), (["--hub_token", "hf_x"], "--hub_token"),
    (["--hub_private_repo", "true"], "--hub_private_repo"), (["--hub_strategy", "end"], "--hub_strategy"),
    (["--hub_always_push"], "--hub_always_push"), (["--hub_revision", "dev"], "--hub_revision"),
    (["--do_eval"], "--do_eval"), (["--prediction_loss_only"], "--prediction_loss_only"),
    (["--no_eval_do_concat_batches"], "--eval_do_concat_batches"), (["--batch_eval_metrics"], "--batch_eval_metrics"),
    (["--include_for_metrics", "inputs"], "--include_for_metrics"),
]
# flags that break the DP guarantee or that DPSAMTrainer's step does not implement: refused by DPSAMConfig under DP
DP_REFUSED = [
    (["--auto_find_batch_size"], "auto_find_batch_size"), (["--neftune_noise_alpha", "5"], "neftune_noise_alpha"),
    (["--torch_compile"], "torch_compile"), (["--use_liger_kernel"], "use_liger_kernel"),
    (["--enable_jit_checkpoint"], "enable_jit_checkpoint"), (["--eval_on_start"], "eval_on_start"),
    (["--data_seed", "3"], "data_seed"), (["--train_sampling_strategy", "sequential"], "train_sampling_strategy"),
    (["--dataloader_drop_last"], "dataloader_drop_last"), (["--no_dataloader_in_order"], "dataloader_in_order"),
    (["--dataloader_num_workers", "1", "--dataloader_prefetch_factor", "4"], "dataloader_prefetch_factor"),
    (["--dataloader_num_workers", "1", "--dataloader_persistent_workers"], "dataloader_persistent_workers"),
    (["--dataloader_num_workers", "1", "--dataloader_multiprocessing_context", "spawn"],
     "dataloader_multiprocessing_context"),
    (["--accelerator_config", '{"split_batches": true}'], "accelerator_config.split_batches"),
]
# flags DPSAMTrainer's own step does not implement, private or not: refused with --no_dp too
STEP_REFUSED = [
    (["--label_smoothing_factor", "0.1"], "label_smoothing_factor"),
    (["--gradient_accumulation_steps", "2"], "gradient_accumulation_steps"),
    (["--fp16"], "fp16"), (["--optim", "lomo"], "optim='lomo'"),
    (["--optim", "schedule_free_adamw"], "optim='schedule_free_adamw'"),
    (["--optim", "galore_adamw_layerwise"], "optim='galore_adamw_layerwise'"),
    (["--torch_empty_cache_steps", "4"], "torch_empty_cache_steps"),
    (["--ddp_bucket_cap_mb", "10"], "ddp_bucket_cap_mb"),
    (["--no_average_tokens_across_devices"], "average_tokens_across_devices"),
]


@pytest.mark.parametrize(("argv", "flag"), SCRIPT_REFUSED + [(["--no_dp", *a], f) for a, f in SCRIPT_REFUSED[:2]],
                         ids=lambda v: v if isinstance(v, str) else None)
def test_flags_it_cannot_honour_are_refused(tmp_path: Path, argv: list[str], flag: str) -> None:
    with pytest.raises(ValueError, match=f"{flag} is not used by train_glue.py"):
        train_glue.main([*argv, "--runs_dir", str(tmp_path / "runs")])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("argv", "flag"), DP_REFUSED + STEP_REFUSED + [(["--no_dp", *a], f) for a, f in STEP_REFUSED],
                         ids=lambda v: v if isinstance(v, str) else None)
def test_flags_that_break_the_guarantee_or_the_step_are_refused_naming_them(tmp_path: Path, argv: list[str],
                                                                            flag: str) -> None:
    with pytest.raises(ValueError, match=re.escape(flag)):
        train_glue.main([*argv, "--runs_dir", str(tmp_path / "runs")])
    assert list(tmp_path.iterdir()) == []


def test_the_defaults_of_refused_flags_are_accepted() -> None:
    defaults = ["--push_to_hub", "false", "--hub_strategy", "every_save", "--do_eval", "false",
                "--label_smoothing_factor", "0", "--gradient_accumulation_steps", "1", "--train_sampling_strategy",
                "random", "--dataloader_drop_last", "false", "--auto_find_batch_size", "false", "--eval_on_start",
                "false", "--dataloader_in_order", "true", "--do_train", "--do_predict"]
    script, config = train_glue.parse_arguments(defaults)
    assert config.dp and config.label_smoothing_factor == 0 and not config.push_to_hub


def test_without_the_script_a_non_private_run_keeps_trainers_flags() -> None:
    """DPSAMTrainer users outside the script: with dp=False the step-level flags are listed, not refused."""
    config = DPSAMConfig(output_dir="out", use_cpu=True, report_to="none", dp=False, label_smoothing_factor=0.1,
                         gradient_accumulation_steps=2)
    assert [problem.split(" ")[0] for problem in config.step_problems()] == ["gradient_accumulation_steps",
                                                                             "label_smoothing_factor:"]


class _StopBeforeTraining(Exception):
    pass


def test_honoured_flags_reach_the_trainer(tmp_path: Path, monkeypatch) -> None:
    """A few flags the script passes on: the Trainer's arguments, its optimizer and scheduler, and (with public
    evaluation data) the validation split evaluated at --eval_on_start."""
    built = {}

    def recording_train(self, resume_from_checkpoint=None, **kwargs):
        if self.args.output_dir.endswith("checkpoints-head"):  # LP-FT's head phase (the default) trains as usual
            return stock_train(self, resume_from_checkpoint, **kwargs)
        self.create_optimizer_and_scheduler(num_training_steps=self.args.max_steps)
        built["trainer"] = self
        raise _StopBeforeTraining

    stock_train = DPSAMTrainer.train
    monkeypatch.setattr(DPSAMTrainer, "train", recording_train)  # the cached trainer's train ends in it too
    flags = ["--learning_rate", "3e-3", "--head_learning_rate", "3e-2", "--weight_decay", "0.01",
             "--adam_beta2", "0.98", "--optim", "adamw_torch", "--lr_scheduler_type", "linear", "--warmup_steps", "1",
             "--per_device_eval_batch_size", "7", "--seed", "5", "--eval_on_start", "--eval_data_is_public", "true",
             "--do_train", "--do_predict"]
    with pytest.raises(_StopBeforeTraining):
        train_glue.main(["--model_name_or_path", str(save_tiny_bert(tmp_path / "tiny")), "--runs_dir",
                         str(tmp_path / "runs"), "--task", "bbc_news", *TINY_RUN, *flags])
    trainer = built["trainer"]
    args = trainer.args
    assert (args.learning_rate, args.per_device_eval_batch_size, args.seed, args.eval_on_start) == (3e-3, 7, 5, True)
    assert args.output_dir == str(tmp_path / "runs" / "bbc_news" / "checkpoints")
    assert type(trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
                ).__name__ == "AdamW"
    groups = trainer.optimizer.param_groups
    assert {g["initial_lr"] for g in groups} == {3e-3, 3e-2}  # the encoder's rate and the head's
    assert all(g["betas"] == (0.9, 0.98) for g in groups)
    assert {g["weight_decay"] for g in groups} == {0.01, 0.0}  # decay except on biases and norms
    assert trainer.lr_scheduler.get_last_lr()[0] == 0.0  # linear warm-up from 0
    assert (trainer.num_samples, len(trainer.eval_dataset)) == (64, 32)  # --max_train/eval_samples; the
    # validation split is evaluated for --eval_on_start


def test_a_head_phase_larger_than_the_data_is_refused(tmp_path: Path) -> None:
    """The default LoRA recipe is private LP-FT; its head phase's Poisson batch cannot exceed the data (64 rows
    here): refused naming the flag, before anything is written (the shared base included)."""
    base = save_tiny_bert(tmp_path / "tiny")
    with pytest.raises(ValueError, match="head phase's expected batch 1024 exceeds the 64 training rows: lower "
                                         "--head_phase_batch_size"):
        train_glue.main(["--model_name_or_path", str(base), "--runs_dir", str(tmp_path / "runs"), "--task",
                         "bbc_news", *TINY_RUN, "--head_phase_batch_size", "1024"])
    assert not (tmp_path / "runs").exists()


def test_a_checkpoint_path_needs_a_single_task(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="names one checkpoint but 2 tasks"):
        train_glue.main(["--tasks", "rotten_tomatoes,bbc_news", "--resume_from_checkpoint", "ckpt",
                         "--runs_dir", str(tmp_path / "runs")])


def test_evaluation_batch_is_large_by_default() -> None:
    flags = train_glue.DP_DEFAULTS
    assert int(flags[flags.index("--per_device_eval_batch_size") + 1]) >= 64


@pytest.mark.slow
def test_trained_adapter_loads_with_stock_classes_and_eval_strategy_runs(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # a relative --runs_dir, as in the README
    base = save_tiny_bert(tmp_path / "tiny")
    evaluating = ["--model_name_or_path", str(base), "--runs_dir", "runs", "--task", "bbc_news",
                  "--eval_strategy", "steps", "--eval_steps", "1", *TINY_RUN]
    with pytest.raises(ValueError, match="evaluating or selecting the model during training on private data"):
        train_glue.main(evaluating)  # under DP only on data declared public (docs/design.md §10)
    train_glue.main([*evaluating, "--eval_data_is_public", "true"])
    assert "'eval_accuracy'" in capsys.readouterr().out  # evaluated on the validation split while training
    adapter = tmp_path / "runs" / "bbc_news" / "adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "."  # the adapter folder itself: no path of this machine
    record = json.loads((adapter / "dp_privacy.json").read_text())
    assert record["base_model"] is None  # the local base has no Hub id (tests/workflow/test_release_paths.py)

    spec = get_task_spec("bbc_news")
    model = PeftModel.from_pretrained(
        load_sequence_classifier(tmp_path / "runs" / "base", num_labels=spec.num_labels, ignore_mismatched_sizes=True),
        adapter,
    ).eval()
    with torch.no_grad():
        expected = model(**tiny_tokenizer()(TEXTS, padding=True, return_tensors="pt")).logits
    for loader, path, cwd in (("peft", ".", adapter), ("auto", "runs/bbc_news/adapter", tmp_path)):  # by path
        answer = load_without_hf_dpmerge(loader, path, cwd=cwd, HF_MODULES_CACHE=str(tmp_path / "modules"))
        assert "error" not in answer, answer
        torch.testing.assert_close(torch.tensor(answer["logits"]), expected, atol=1e-5, rtol=0)
        assert list(answer["id2label"].values()) == list(spec.label_names)


def test_a_cached_hub_id_is_accepted_offline(tmp_path: Path, monkeypatch) -> None:
    from huggingface_hub import constants
    from transformers import AutoConfig

    from hf_dpmerge.utils.io import require_model_source

    repo = tmp_path / "models--me--tiny"
    save_tiny_bert(repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    require_model_source("me/tiny")  # what transformers loads offline from the cache
    assert AutoConfig.from_pretrained("me/tiny", cache_dir=tmp_path, local_files_only=True).model_type == "bert"
    with pytest.raises(FileNotFoundError, match="me/absent is not in the Hugging Face cache"):
        require_model_source("me/absent")


def test_the_base_hub_id_is_the_source_or_the_packaged_models_origin(tmp_path: Path) -> None:
    from hf_dpmerge.data import default_model_path
    from hf_dpmerge.data.model_path import source_hub_id

    assert source_hub_id(default_model_path()) == "sentence-transformers/all-MiniLM-L6-v2"
    assert source_hub_id("me/tinyroberta") == "me/tinyroberta"
    assert source_hub_id(save_tiny_bert(tmp_path / "local")) is None  # a local model of unknown origin


def test_every_flag_of_the_help_is_in_the_honoured_or_refused_table() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "bad-inputs.md").read_text(encoding="utf-8")
    table = docs.split("## `examples/train_glue.py`: every flag honoured or refused")[1].split("\n## ")[0]
    parser = train_glue.argument_parser()
    flags = {action.dest for action in parser._actions if action.dest != "help"}
    missing = sorted(name for name in flags if f"`--{name}" not in table)
    assert not missing, f"flags of --help that docs/bad-inputs.md does not say are honoured or refused: {missing}"


@pytest.mark.slow
def test_half_precision_prediction_leaves_the_release_in_full_precision(tmp_path: Path) -> None:
    """--fp16_full_eval casts the model for prediction; the adapter is released before that, in float32."""
    from safetensors.torch import load_file

    train_glue.main(["--model_name_or_path", str(save_tiny_bert(tmp_path / "tiny")), "--runs_dir",
                     str(tmp_path / "runs"), "--task", "bbc_news", *TINY_RUN, "--fp16_full_eval"])
    weights = load_file(str(tmp_path / "runs" / "bbc_news" / "adapter" / "adapter_model.safetensors"))
    assert {str(tensor.dtype) for tensor in weights.values()} == {"torch.float32"}
    assert "accuracy" in json.loads((tmp_path / "runs" / "bbc_news" / "eval_metrics.json").read_text())["test"]


@pytest.mark.slow
def test_head_only_run_with_the_default_recipe_trains_on_cached_features(tmp_path: Path) -> None:
    """--train_lora false takes the head-only recipe and trains the head on cached features; the explicit λ > 0
    and dp_sat of the LoRA recipe no longer crash (alignment skipped and recorded as λ = 0); the release is a
    peft adapter whose LoRA B is 0, as before."""
    from safetensors.torch import load_file

    from hf_dpmerge.training.recipe import DP_RECIPE, HEAD_ONLY_RECIPE

    config = train_glue.parse_arguments(["--train_lora", "false"])[1]
    recipe = train_glue.argument_parser().parse_args_into_dataclasses([*DP_RECIPE, *HEAD_ONLY_RECIPE])[1]
    lora_recipe = train_glue.parse_arguments([])[1]
    assert (config.max_steps, config.per_device_train_batch_size) == (recipe.max_steps,
                                                                     recipe.per_device_train_batch_size)
    assert config.max_steps != lora_recipe.max_steps and (config.sam_mode, config.align_lambda) == ("none", 0.0)
    train_glue.main(["--model_name_or_path", str(save_tiny_bert(tmp_path / "tiny")), "--runs_dir",
                     str(tmp_path / "runs"), "--task", "bbc_news", "--train_lora", "false", *TINY_RUN,
                     "--align_lambda", "0.05", "--sam_mode", "dp_sat", "--max_steps", "5"])
    adapter = tmp_path / "runs" / "bbc_news" / "adapter"
    record = json.loads((adapter / "dp_privacy.json").read_text())
    assert (record["steps"], record["align_lambda"], record["extra"]["train_lora"]) == (5, 0.0, False)
    weights = load_file(str(adapter / "adapter_model.safetensors"))
    assert all(tensor.abs().sum() == 0 for key, tensor in weights.items() if ".lora_B." in key)
    assert any("classifier" in key for key in weights)
    assert "accuracy" in json.loads((tmp_path / "runs" / "bbc_news" / "eval_metrics.json").read_text())["test"]
    assert (tmp_path / "runs" / "bbc_news" / "encoder_adapter" / "dp_privacy.json").exists()


def test_frozen_shared_a_reaches_the_model_and_the_record(tmp_path: Path, monkeypatch) -> None:
    """--lora_freeze_a / --lora_a_seed: the trainer's model has frozen A's drawn from the seed (none of them
    trainable or noised) and the record names the seed and A's fingerprint."""
    from hf_dpmerge.training.lora_classifier import lora_sequence_classifier
    from hf_dpmerge.training.shared_lora_a import freeze_shared_lora_a, frozen_lora_a_record, lora_a_fingerprint

    built = {}

    def recording_train(self, resume_from_checkpoint=None, **kwargs):
        if self.args.output_dir.endswith("checkpoints-head"):  # LP-FT's head phase (the default) trains as usual
            return stock_train(self, resume_from_checkpoint, **kwargs)
        built["trainer"] = self
        raise _StopBeforeTraining

    stock_train = DPSAMTrainer.train
    monkeypatch.setattr(DPSAMTrainer, "train", recording_train)
    with pytest.raises(_StopBeforeTraining):
        train_glue.main(["--model_name_or_path", str(save_tiny_bert(tmp_path / "tiny")), "--runs_dir",
                         str(tmp_path / "runs"), "--task", "bbc_news", *TINY_RUN, "--lora_freeze_a", "true",
                         "--lora_a_seed", "11", "--lora_r", "2", "--lora_layers", "all"])
    trainer = built["trainer"]
    assert not any(".lora_A." in name for name in trainer._param_names)
    assert any(".lora_B." in name for name in trainer._param_names)
    spec = get_task_spec("bbc_news")
    reference = lora_sequence_classifier(tmp_path / "runs" / "base", spec, r=2, alpha=16,
                                         target_modules=["query", "value"], layers="all")
    assert lora_a_fingerprint(trainer.model) == freeze_shared_lora_a(reference, 11)
    assert frozen_lora_a_record(trainer.model) == {"seed": 11, "fingerprint": lora_a_fingerprint(trainer.model)}
