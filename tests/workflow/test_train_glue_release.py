"""examples/train_glue.py honours or refuses the flags its --help shows, and releases adapters that stock
transformers/peft load as the function hf_dpmerge trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel

from hf_dpmerge.data import get_task_spec
from hf_dpmerge.modeling import load_sequence_classifier
from hf_dpmerge.scripts import train as train_glue  # what examples/train_glue.py runs
from tests.utils.stock_loading import TEXTS, load_without_hf_dpmerge
from tests.utils.tiny_models import save_tiny_bert, tiny_tokenizer

TINY_RUN = ["--max_steps", "2", "--max_train_samples", "64", "--max_eval_samples", "32",
            "--per_device_train_batch_size", "16", "--physical_batch_size", "16", "--max_length", "16",
            "--target_epsilon", "8", "--logging_steps", "1"]


@pytest.mark.parametrize("flag", ["--output_dir", "--push_to_hub", "--hub_model_id=me/x"])
def test_flags_it_cannot_honour_are_refused(tmp_path: Path, flag: str) -> None:
    argv = [flag, "somewhere"] if "=" not in flag and flag != "--push_to_hub" else [flag]
    with pytest.raises(ValueError, match=f"{flag.split('=')[0]} is not used by train_glue.py"):
        train_glue.main([*argv, "--runs_dir", str(tmp_path / "runs")])
    assert list(tmp_path.iterdir()) == []


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
    assert config["base_model_name_or_path"] == str((adapter / "base").resolve())
    record = json.loads((adapter / "dp_privacy.json").read_text())
    assert record["base_model"] == str((tmp_path / "runs" / "base").resolve())  # never the relative runs/base

    spec = get_task_spec("bbc_news")
    model = PeftModel.from_pretrained(
        load_sequence_classifier(tmp_path / "runs" / "base", num_labels=spec.num_labels, ignore_mismatched_sizes=True),
        adapter,
    ).eval()
    with torch.no_grad():
        expected = model(**tiny_tokenizer()(TEXTS, padding=True, return_tensors="pt")).logits
    for loader in ("peft", "auto"):
        answer = load_without_hf_dpmerge(loader, adapter, HF_MODULES_CACHE=str(tmp_path / "modules"))
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
