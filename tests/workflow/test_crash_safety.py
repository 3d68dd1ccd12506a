"""Crash safety: kill -9 during training or merging, interrupted saves, and outputs replaced only on request."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import peft
import pytest
import torch
from mergekit.common import ModelReference
from mergekit.config import MergeConfiguration
from mergekit.options import MergeOptions
from safetensors.torch import load_file

from hf_dpmerge.cli.main import main as hf_dpmerge
from hf_dpmerge.merging import run as merge_run
from hf_dpmerge.merging.lora_cache import drop_stale_lora_merges
from hf_dpmerge.records.record import PRIVACY_RECORD_NAME, PrivacyRecord
from hf_dpmerge.training.dp.state import DP_STATE_NAME, last_complete_checkpoint, missing_checkpoint_files
from tests.utils import crash_training
from tests.utils.merging_builders import lora_config_yaml
from tests.utils.tiny_models import tiny_bert
from tests.utils.training_helpers import make_trainer

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1"}


def _start(args: list[str], log: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], env={**ENV, **env}, cwd=log.parent,
                            stdout=subprocess.DEVNULL, stderr=log.open("w"))


def _kill_when(marker: Path, process: subprocess.Popen, log: Path, timeout: float = 1800) -> None:
    """SIGKILL ``process`` once it has created ``marker``."""
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if process.poll() is not None:
            raise AssertionError(f"exited with {process.returncode} before {marker.name}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"{marker} did not appear within {timeout} s")
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=60) == -signal.SIGKILL


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


# ---------------------------------------------------------------------------------------- training


@pytest.mark.slow
def test_training_killed_while_checkpointing_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    script = ["-m", "tests.utils.crash_training"]
    full, crashed = tmp_path / "full", tmp_path / "crashed"
    full.mkdir()
    crashed.mkdir()
    crash_training.main(full, "full")  # the uninterrupted reference, in this process

    victim = _start([*script, str(crashed), "pause"], crashed / "log.txt")
    _kill_when(crashed / "paused", victim, crashed / "log.txt")
    checkpoints = crashed / "out"
    assert missing_checkpoint_files(checkpoints / "checkpoint-6") == ["trainer_state.json"]  # killed mid-write
    assert last_complete_checkpoint(checkpoints).name == "checkpoint-4"
    assert not (crashed / "adapter").exists()

    crash_training.main(crashed, "resume")  # the resume need not be killable: in this process, as the reference
    resumed, reference = PrivacyRecord.load(crashed / "adapter"), PrivacyRecord.load(full / "adapter")
    assert resumed.steps == reference.steps == 8
    assert resumed.epsilon == pytest.approx(reference.epsilon, rel=1e-12) and resumed.epsilon > 0
    assert resumed.sum_lr_squared == pytest.approx(reference.sum_lr_squared, rel=1e-12)
    history = [torch.load(run / "out" / "checkpoint-8" / DP_STATE_NAME, weights_only=False)["accountant"]["history"]
               for run in (crashed, full)]
    assert history[0] == history[1] and sum(n for _, _, n in history[0]) == 8

    weights, expected = load_file(crashed / "adapter" / "adapter_model.safetensors"), load_file(
        full / "adapter" / "adapter_model.safetensors")
    assert weights.keys() == expected.keys()
    for name in weights:
        torch.testing.assert_close(weights[name], expected[name], rtol=1e-5, atol=1e-6)
    model = peft.PeftModel.from_pretrained(tiny_bert(), crashed / "adapter")
    lora_b = next(k for k in weights if "lora_B" in k)
    loaded = dict(model.named_parameters())[lora_b.replace(".weight", ".default.weight")]
    torch.testing.assert_close(loaded, weights[lora_b])


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory):
    """A trainer after one private step with a checkpoint (so its output_dir is a non-empty run folder)."""
    trainer = make_trainer(tmp_path_factory.mktemp("run"), max_steps=1, save_strategy="steps", save_steps=1)
    trainer.train()
    return trainer


def _fail_writing_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    def partial_write(tensors, filename, *args, **kwargs):
        Path(filename).write_bytes(b"\x00" * 64)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(peft.peft_model, "safe_save_file", partial_write)


def _fail_writing_record(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_save(self, directory):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(PrivacyRecord, "save", failing_save)


@pytest.mark.parametrize("fail", [_fail_writing_weights, _fail_writing_record])
def test_interrupted_release_leaves_nothing_and_keeps_the_previous_release(trained, tmp_path: Path, monkeypatch,
                                                                          fail) -> None:
    previous = tmp_path / "previous"
    trained.save_model(str(previous))
    before = _files(previous)
    fail(monkeypatch)
    with pytest.raises(OSError, match=f"No space left on device while writing {tmp_path / 'fresh'}"):
        trained.save_model(str(tmp_path / "fresh"))
    with pytest.raises(OSError, match="No space left"):
        trained.save_model(str(previous), overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["previous"]  # no output, no scratch
    assert _files(previous) == before


def test_release_into_a_run_folder_moves_the_record_last(trained, monkeypatch) -> None:
    run = Path(trained.args.output_dir)
    trained.save_model()  # the run's output_dir, beside its checkpoint
    assert (run / "checkpoint-1" / DP_STATE_NAME).exists() and (run / PRIVACY_RECORD_NAME).exists()
    replace = os.replace

    def crash_before_the_weights(source, destination):
        if Path(destination) == run / "adapter_model.safetensors":
            raise OSError(errno.EIO, "simulated crash")
        replace(source, destination)

    monkeypatch.setattr(os, "replace", crash_before_the_weights)
    with pytest.raises(OSError, match="simulated crash"):
        trained.save_model(overwrite=True)
    assert not (run / PRIVACY_RECORD_NAME).exists()  # the half-replaced release does not look complete
    assert (run / "checkpoint-1" / DP_STATE_NAME).exists()
    assert [p.name for p in run.parent.iterdir() if p.name.startswith(".")] == []


def test_a_release_is_replaced_only_with_overwrite(trained, tmp_path: Path) -> None:
    target = tmp_path / "adapter"
    trained.save_model(str(target))
    before = load_file(target / "adapter_model.safetensors")
    with torch.no_grad():
        trained._params[0].add_(1.0)
    try:
        with pytest.raises(FileExistsError, match=f"{target} already holds a released adapter"):
            trained.save_model(str(target))
        assert load_file(target / "adapter_model.safetensors").keys() == before.keys()
        trained.save_model(str(target), overwrite=True)
        after = load_file(target / "adapter_model.safetensors")
        assert any(not torch.equal(after[k], before[k]) for k in before)
        assert PrivacyRecord.load(target).steps == 1
    finally:
        with torch.no_grad():
            trained._params[0].sub_(1.0)


def test_generator_states_are_written_into_checkpoints_only(trained, tmp_path: Path) -> None:
    assert (Path(trained.args.output_dir) / "checkpoint-1" / DP_STATE_NAME).exists()
    trained.save_model(str(tmp_path / "pushed"), _internal_call=True)  # what push_to_hub saves
    trained.save_model(str(tmp_path / "released"))
    for directory in ("pushed", "released"):
        assert (tmp_path / directory / PRIVACY_RECORD_NAME).exists()
        assert not (tmp_path / directory / DP_STATE_NAME).exists()


def test_resume_picks_the_last_complete_checkpoint_and_refuses_an_incomplete_one(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path)
    run = Path(trainer.args.output_dir)
    for step, files in ((2, (DP_STATE_NAME, "trainer_state.json")), (4, (DP_STATE_NAME,)), (10, ())):
        (run / f"checkpoint-{step}").mkdir(parents=True)
        for name in files:
            (run / f"checkpoint-{step}" / name).write_text("{}")
    assert last_complete_checkpoint(run) == run / "checkpoint-2"
    with pytest.raises(FileNotFoundError, match=r"checkpoint-4 lacks \['trainer_state.json'\]"):
        trainer.train(resume_from_checkpoint=str(run / "checkpoint-4"))
    with pytest.raises(ValueError, match="no complete checkpoint"):
        last_complete_checkpoint(tmp_path / "nowhere")


# ---------------------------------------------------------------------------------------- merging


@pytest.fixture(scope="module")
def merge_workdir(merge_runs) -> Path:
    root = merge_runs({"a": 2, "b": 3}).parent
    adapters = ["./runs/a/encoder_adapter", "./runs/b/encoder_adapter"]
    (root / "merge.yaml").write_text(lora_config_yaml("dp_aware", "./runs/base", adapters))
    return root


@pytest.mark.slow
def test_merge_killed_after_writing_leaves_no_complete_looking_output(merge_workdir: Path, monkeypatch) -> None:
    args = ["-m", "tests.utils.crash_merge", "paused", "merge.yaml", "merged", "--lora-merge-cache", "cache"]
    log, marker, out = merge_workdir / "log.txt", merge_workdir / "paused", merge_workdir / "merged"
    _kill_when(marker, _start(args, log), log)
    assert not out.exists()
    scratch = [p for p in merge_workdir.iterdir() if p.name.startswith(".merged.")]
    assert [p.name.startswith(".merged.incomplete-") for p in scratch] == [True]
    assert {"config.json", "model.safetensors"} <= set(_files(scratch[0] / "merged"))  # killed after writing

    monkeypatch.chdir(merge_workdir)  # the merge that completes need not be killable: in this process
    assert hf_dpmerge(["merge", "merge.yaml", "merged", "--lora-merge-cache", "cache", "--quiet"]) == 0
    before = _files(out)
    assert {"config.json", "model.safetensors", "mergekit_config.yml"} <= set(before)

    marker.unlink()
    _kill_when(marker, _start([*args, "--overwrite"], log), log)  # re-merging over it, killed
    assert _files(out) == before


def _stub_merge(config, out_path: str, options, config_source: str) -> None:
    Path(out_path).mkdir()
    (Path(out_path) / "config.json").write_text(json.dumps({"merge": config.merge_method}))
    (Path(out_path) / "mergekit_config.yml").write_text(f"merge_method: {config.merge_method}\n")


def _stub_config(method: str) -> dict:
    return {"merge_method": method, "models": [{"model": "a", "parameters": {"weight": 1.0}}]}


def test_merge_output_is_replaced_only_when_it_is_a_previous_merge_and_overwrite_is_set(tmp_path: Path,
                                                                                         monkeypatch) -> None:
    monkeypatch.setattr(merge_run, "run_merge", _stub_merge)
    options = MergeOptions(write_model_card=False)
    foreign, previous = tmp_path / "foreign", tmp_path / "previous"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    merge_run.merge(_stub_config("linear"), previous, options=options)
    (previous / "stale.txt").write_text("from the first merge")

    for target in (foreign, previous):
        with pytest.raises(FileExistsError, match=f"{target} exists and is not empty; pass --overwrite"):
            merge_run.merge(_stub_config("ties"), target, options=options)
    with pytest.raises(FileExistsError, match="holds no previous merge"):
        merge_run.merge(_stub_config("ties"), foreign, options=options, overwrite=True)
    assert _files(foreign) == {"notes.txt": b"mine"}
    merge_run.merge(_stub_config("ties"), previous, options=options, overwrite=True)
    assert sorted(_files(previous)) == ["config.json", "mergekit_config.yml"]
    assert json.loads((previous / "config.json").read_text()) == {"merge": "ties"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign", "previous"]


def test_truncated_lora_merge_cache_entry_is_rebuilt(merge_workdir: Path, tmp_path: Path) -> None:
    runs = merge_workdir / "runs"
    reference = ModelReference.parse(f"{runs / 'base'}+{runs / 'a' / 'encoder_adapter'}")
    entry = Path(reference.merged(cache_dir=str(tmp_path)).model.path)
    config = MergeConfiguration.model_validate(
        {"merge_method": "linear", "models": [{"model": str(reference), "parameters": {"weight": 1.0}}]}
    )
    drop_stale_lora_merges(config, str(tmp_path))
    assert entry.is_dir()  # complete and fresh: kept
    shard = entry / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])  # what a process killed mid-write leaves
    with pytest.warns(UserWarning, match="stale or incomplete"):
        drop_stale_lora_merges(config, str(tmp_path))
    assert not entry.exists()
