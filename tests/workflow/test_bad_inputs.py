"""The bad-input matrix of docs/bad-inputs.md, for the cases no other test file covers: each ends in an
error that names the problem and leaves nothing half-written."""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from mergekit.io.tensor_writer import TensorWriter
from peft import IA3Config, LoraConfig, get_peft_model

from hf_dpmerge.cli.main import main
from hf_dpmerge.lora import UnsupportedAdapterError
from hf_dpmerge.records.fingerprint import base_fingerprint, peft_base_tensors
from hf_dpmerge.records.record import PRIVACY_RECORD_NAME, PrivacyRecord
from hf_dpmerge.scripts import train as train_script
from tests.utils.merging_builders import adamw_record, lora_config_yaml
from tests.utils.tiny_models import save_tiny_bert, tiny_bert
from tests.utils.training_helpers import lm_dataset, lora_classifier, make_trainer, text_dataset


@pytest.fixture
def read_only_dir(tmp_path: Path):
    """A directory nothing can be created in: mode 0555, and for root (which ignores modes) ``chattr +i``."""
    directory = tmp_path / "read_only"
    directory.mkdir()
    directory.chmod(0o555)
    immutable = False
    if os.access(directory, os.W_OK):
        chattr = shutil.which("chattr")
        immutable = chattr is not None and subprocess.run([chattr, "+i", str(directory)]).returncode == 0
        if not immutable:
            directory.chmod(0o755)
            pytest.skip("running as root without a working `chattr +i`: cannot make a directory read-only")
    yield directory
    if immutable:
        subprocess.run([shutil.which("chattr"), "-i", str(directory)], check=True)
    directory.chmod(0o755)


# ---------------------------------------------------------------------------------------- training


def test_classifier_data_without_a_label_column_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"train_dataset has no label column .*num_labels=2"):
        make_trainer(tmp_path, dataset=text_dataset().remove_columns(["label"]))


def test_a_raw_text_dataset_is_refused_with_the_call_that_tokenizes_it(tmp_path: Path) -> None:
    raw = text_dataset().remove_columns(["input_ids", "attention_mask"])
    with pytest.raises(ValueError, match=r"raw text \(columns \['text'\]\) and no input_ids.*"
                                         r"train_dataset.map\(lambda batch: tokenizer\(batch\['text'\]"):
        make_trainer(tmp_path, dataset=raw)


def test_batches_without_labels_stop_at_the_first_step(tmp_path: Path, lora_model) -> None:
    model = lora_model("causal_lm")
    data = lm_dataset(["a dull script", "markets rallied"] * 20)
    trainer = make_trainer(tmp_path, model=model, dataset=data, save_strategy="steps", save_steps=1)
    with pytest.raises(ValueError, match="needs 'labels' in every batch"):
        trainer.train()
    assert not list((tmp_path / "out").glob("checkpoint-*"))


def test_class_ids_the_model_has_no_output_for_are_refused(tmp_path: Path) -> None:
    data = text_dataset().map(lambda row, i: {"label": [0, 1, 2, 5][i % 4]}, with_indices=True)
    with pytest.raises(ValueError, match=r"class ids \[2, 5\] outside \[0, 2\) .*\(100 rows\)"):
        make_trainer(tmp_path, dataset=data)


def test_nan_weights_stop_training_at_step_one_and_are_never_released(tmp_path: Path) -> None:
    model = lora_classifier()
    name, lora_b = next((n, p) for n, p in model.named_parameters() if "lora_B" in n)
    with torch.no_grad():
        lora_b.fill_(float("nan"))
    trainer = make_trainer(tmp_path, model=model, save_strategy="steps", save_steps=1)
    with pytest.raises(FloatingPointError, match="step 1: the training loss is nan"):
        trainer.train()
    with pytest.raises(FloatingPointError, match=f"{re.escape(name)} holds NaN"):
        trainer.save_model(str(tmp_path / "adapter"))
    assert not (tmp_path / "adapter").exists() and not list((tmp_path / "out").glob("checkpoint-*"))


def test_a_diverging_loss_stops_at_the_step_it_happens(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, learning_rate=1e30, max_steps=6, save_strategy="steps", save_steps=1)
    with pytest.raises(FloatingPointError, match=r"step 2: the training loss is (nan|inf)"):
        trainer.train()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["checkpoint-1"]  # step 1 was finite


def test_adapters_other_than_lora_are_refused(tmp_path: Path) -> None:
    model = get_peft_model(tiny_bert(), IA3Config(target_modules=["query", "value"], feedforward_modules=[]))
    with pytest.raises(UnsupportedAdapterError, match="adapter 'default' is IA3: DPSAMTrainer trains LoRA"):
        make_trainer(tmp_path, model=model, align_lambda=0.0)


def test_dora_is_refused_where_opacus_computes_per_sample_gradients(tmp_path: Path, lora_model) -> None:
    with pytest.raises(UnsupportedAdapterError, match="DoRA layers .* no opacus per-sample gradient rule"):
        make_trainer(tmp_path, model=lora_model("dora"), align_lambda=0.0, sam_mode="dp_sat")
    assert make_trainer(tmp_path, model=lora_model("dora"), align_lambda=0.0, sam_mode="per_example").args.dp


def test_resuming_from_a_nonexistent_checkpoint_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "checkpoint-7"
    with pytest.raises(FileNotFoundError, match=f"{re.escape(str(missing))} lacks .*dp_state.pt"):
        make_trainer(tmp_path).train(resume_from_checkpoint=str(missing))


def test_release_into_a_read_only_directory(tmp_path: Path, read_only_dir: Path) -> None:
    trainer = make_trainer(tmp_path, max_steps=1)
    trainer.train()
    with pytest.raises(PermissionError, match=re.escape(str(read_only_dir))):
        trainer.save_model(str(read_only_dir / "adapter"))
    assert list(read_only_dir.iterdir()) == []


def test_record_write_on_a_full_disk_keeps_the_previous_record(tmp_path: Path, monkeypatch) -> None:
    adamw_record(task="old").save(tmp_path)
    fdopen = os.fdopen

    class FullDisk:
        def __init__(self, fd: int, mode: str) -> None:
            self.handle = fdopen(fd, mode)

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.handle.close()

        def write(self, text: str) -> None:
            self.handle.write(text[: len(text) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fdopen", FullDisk)
    with pytest.raises(OSError, match="No space left on device"):
        adamw_record(task="new").save(tmp_path)
    monkeypatch.undo()
    assert PrivacyRecord.load(tmp_path).task == "old"
    assert [p.name for p in tmp_path.iterdir()] == [PRIVACY_RECORD_NAME]


@pytest.mark.parametrize("pooling", [[], ["--classifier_pooling", "cls"]], ids=["default-pooling", "given-pooling"])
def test_train_glue_names_a_nonexistent_model_path(tmp_path: Path, pooling: list[str]) -> None:
    with pytest.raises(FileNotFoundError, match=f"model directory {re.escape(str(tmp_path / 'nope'))} does not"):
        train_script.main(["--model_name_or_path", str(tmp_path / "nope"), "--runs_dir", str(tmp_path / "runs"),
                         *pooling])
    assert list(tmp_path.iterdir()) == []


def test_train_glue_refuses_to_replace_a_release_before_training(tmp_path: Path) -> None:
    adapter = tmp_path / "runs" / "rotten_tomatoes" / "adapter"
    adamw_record(task="rotten_tomatoes").save(adapter)
    base = save_tiny_bert(tmp_path / "tiny")
    with pytest.raises(FileExistsError, match="already holds a released adapter .*overwrite"):
        train_script.main(["--model_name_or_path", str(base), "--runs_dir", str(tmp_path / "runs")])
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["rotten_tomatoes"]  # no base built


def test_train_glue_names_an_unknown_task_before_writing_anything(tmp_path: Path) -> None:
    for flag in ("--task", "--tasks"):
        with pytest.raises(ValueError, match=r"unknown task 'rotten_tomato' \(did you mean 'rotten_tomatoes'\?\)"):
            train_script.main([flag, "rotten_tomato", "--runs_dir", str(tmp_path / "runs")])
    assert list(tmp_path.iterdir()) == []


def test_lora_target_modules_that_match_nothing_are_refused(tmp_path: Path) -> None:
    from hf_dpmerge.data.tasks import get_task_spec
    from hf_dpmerge.training.lora_classifier import lora_sequence_classifier

    base = save_tiny_bert(tmp_path / "tiny")
    with pytest.raises(ValueError, match=r"'querry' \(did you mean 'query'\?\) match no module .*'value'"):
        lora_sequence_classifier(base, get_task_spec("rotten_tomatoes"), r=2, alpha=4,
                                 target_modules=["querry", "value"])
    model = lora_sequence_classifier(base, get_task_spec("rotten_tomatoes"), r=2, alpha=4,
                                     target_modules=["query", "value"])
    assert {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in model.named_parameters() if "lora_A" in n} == {
        "query", "value"}


@pytest.mark.slow
def test_train_glue_privacy_unit_column_keeps_the_films_or_names_a_missing_column(tmp_path: Path) -> None:
    base = save_tiny_bert(tmp_path / "tiny")
    common = ["--model_name_or_path", str(base), "--max_train_samples", "120", "--max_eval_samples", "20",
              "--max_steps", "1", "--per_device_train_batch_size", "4", "--max_length", "16", "--use_cpu",
              "--head_phase_steps", "1", "--head_phase_batch_size", "4"]  # LP-FT, the default: both phases per film
    with pytest.raises(ValueError, match="--privacy_unit_column author: task rotten_tomatoes has no such column"):
        train_script.main([*common, "--runs_dir", str(tmp_path / "bad"), "--privacy_unit_column", "author"])
    train_script.main([*common, "--runs_dir", str(tmp_path / "runs"), "--privacy_unit_column", "movie"])
    record = json.loads((tmp_path / "runs" / "rotten_tomatoes" / "adapter" / "dp_privacy.json").read_text())
    assert record["privacy_unit"] == "unit:movie" and record["num_samples"] == 120
    assert 4 <= record["num_units"] < 120 and record["sample_rate"] == pytest.approx(4 / record["num_units"])
    assert [phase["sample_rate"] for phase in record["extra"]["phases"]] == [pytest.approx(4 / record["num_units"])] * 2


# ---------------------------------------------------------------------------------------- merging


@pytest.fixture(scope="module")
def workdir(merge_runs) -> Path:
    """runs/base with adapters a and b, a second base, and broken copies of a's encoder adapter."""
    runs = merge_runs({"a": 2, "b": 3})
    root = runs.parent
    save_tiny_bert(runs / "other_base", seed=1)
    good = runs / "a" / "encoder_adapter"

    newer = shutil.copytree(good, root / "broken" / "newer_schema")
    data = json.loads((newer / PRIVACY_RECORD_NAME).read_text())
    (newer / PRIVACY_RECORD_NAME).write_text(json.dumps({**data, "schema_version": 99}))

    foreign = shutil.copytree(good, root / "broken" / "foreign_record")  # the record of a query-only adapter
    record = PrivacyRecord.load(foreign)
    covered = [name for name in record.base_model_hash_tensors if ".query." in name]
    base = {k: v for k, v in tiny_bert(num_labels=2, seed=0).state_dict().items() if k in covered}
    record.base_model_hash_tensors, record.base_model_hash = covered, base_fingerprint(base)
    record.save(foreign)

    truncated = shutil.copytree(good, root / "broken" / "truncated")
    weights = truncated / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])

    dora = get_peft_model(tiny_bert(num_labels=2, seed=0),
                          LoraConfig(r=2, target_modules=["query", "value"], use_dora=True))
    dora.save_pretrained(root / "broken" / "dora")
    tensors = peft_base_tensors(dora)
    adamw_record(base_model_hash=base_fingerprint(tensors), base_model_hash_tensors=sorted(tensors)).save(
        root / "broken" / "dora")
    return root


ADAPTERS = ["./runs/a/encoder_adapter", "./runs/b/encoder_adapter"]
WEIGHT = "    parameters: {weight: 1.0}\n"  # mergekit's task_arithmetic needs each input's


def _merge(workdir: Path, config: str | None, *flags: str, out: str = "out") -> int:
    if config is not None:
        (workdir / "bad.yaml").write_text(config)
    code = main(["merge", "bad.yaml" if config is not None else "absent.yaml", out, *flags,
                 "--lora-merge-cache", "cache", "--quiet"])
    assert not (workdir / out).exists() and not list(workdir.glob(f".{Path(out).name}.*"))
    return code


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (None, "no merge config at absent.yaml"),
        ("", "merge config bad.yaml is empty or not a mapping"),
        (lora_config_yaml("dp_awre", "./runs/base", ADAPTERS),
         "unknown merge_method 'dp_awre' (did you mean 'dp_aware'?)"),
        (lora_config_yaml("dp_aware", "./runs/nobase", ADAPTERS), "base model directory ./runs/nobase does not exist"),
        (lora_config_yaml("task_arithmetic", "./runs/base", [ADAPTERS[0], "./runs/missing/encoder_adapter"],
                          per_model=WEIGHT), "merge input directory ./runs/missing/encoder_adapter does not exist"),
        (lora_config_yaml("dp_aware", "./runs/base", [ADAPTERS[0], "./broken/newer_schema"]),
         "privacy record schema 99 is newer than this hf_dpmerge understands"),
        (lora_config_yaml("dp_aware", "./runs/base", [ADAPTERS[0], "./broken/foreign_record"]),
         "dp_privacy.json does not belong to this adapter"),
        (lora_config_yaml("dp_aware", "./runs/base", ADAPTERS,
                          per_model="    parameters:\n      max_grad_norm: -1.0\n"),
         "privacy record has invalid values: max_grad_norm=-1.0"),
        (lora_config_yaml("dp_aware", "./runs/base", ADAPTERS, per_model="    parameters:\n      epsilon: 1.0\n"),
         "unknown per-model parameter 'epsilon'"),
        (lora_config_yaml("dp_aware", "./runs/base", ADAPTERS).replace(
            "./runs/base+./runs/b", "./runs/other_base+./runs/b"), "mixed base models in one merge"),
        (lora_config_yaml("task_arithmetic", "./runs/other_base", ADAPTERS, per_model=WEIGHT),
         "input ./runs/other_base+./runs/a/encoder_adapter was trained on another base model"),
        (lora_config_yaml("cauchy_poe", "./runs/base", [ADAPTERS[0], "./broken/dora"]),
         "is a DoRA adapter (use_dora: true): hf_dpmerge's merge methods support plain LoRA adapters only"),
        (lora_config_yaml("dp_aware", "./runs/base", [ADAPTERS[0], "./broken/truncated"]),
         "broken/truncated/adapter_model.safetensors: unreadable adapter weights"),
        (lora_config_yaml("task_arithmetic", "./runs/base", ADAPTERS, "paramters:\n  lambda: 0.5\n"),
         "unknown key 'paramters' (did you mean 'parameters'?)"),
        (lora_config_yaml("dp_aware", "./runs/base", ADAPTERS, "parameters:\n  lambda: 0.5\n",
                          per_model="    paramters:\n      weight: 1.0\n"),
         "unknown key models[0].'paramters' (did you mean 'parameters'?)"),
        (lora_config_yaml("dp_aware", "./runs/base", ADAPTERS, ""), "dp_aware needs lambda under the top-level"),
        (lora_config_yaml("task_arithmetic", "./runs/base", ADAPTERS, "parameters:\n  lambda: abc\n"),
         "task_arithmetic: parameters.lambda = 'abc': Input should be a valid number"),
    ],
    ids=["missing_config", "empty_yaml", "unknown_method", "missing_base", "stock_method_missing_run", "newer_schema",
         "foreign_record",
         "invalid_override", "guarantee_override", "mixed_bases", "stock_method_other_base", "dora", "truncated",
         "top_level_typo", "model_level_typo", "no_scale", "bad_value"],
)
def test_bad_merge_inputs_fail_before_any_output(workdir: Path, monkeypatch, capsys, config: str | None,
                                                 message: str) -> None:
    monkeypatch.chdir(workdir)
    assert _merge(workdir, config) == 2
    assert message in capsys.readouterr().err


def test_a_stock_merge_on_the_runs_base_is_released_and_one_on_another_base_is_refused(workdir: Path, monkeypatch,
                                                                                       capsys) -> None:
    """task_arithmetic through hf-dpmerge merge on the base the adapters trained on is written and push stages it,
    its card saying the fingerprints were checked; the same merge onto another base, as plain mergekit writes it
    (its own methods check no base), is refused by push --dry-run before anything is staged."""
    from mergekit.config import MergeConfiguration
    from mergekit.merge import run_merge
    from mergekit.options import MergeOptions

    monkeypatch.chdir(workdir)
    (workdir / "stock.yaml").write_text(lora_config_yaml("task_arithmetic", "./runs/base", ADAPTERS, per_model=WEIGHT))
    assert main(["merge", "stock.yaml", "stock", "--lora-merge-cache", "cache", "--quiet"]) == 0
    assert main(["push", "stock", "--runs", "runs", "--dry-run"]) == 0
    card = (workdir / "stock-hub" / "README.md").read_text()
    assert "All adapters record the same base fingerprint" in card and "checked when the release was staged" in card

    config = lora_config_yaml("task_arithmetic", "./runs/other_base", ADAPTERS, per_model=WEIGHT)
    run_merge(MergeConfiguration.model_validate(yaml.safe_load(config)), "plain", options=MergeOptions(
        lora_merge_cache="cache", quiet=True), config_source=config)
    capsys.readouterr()
    assert main(["push", "plain", "--runs", "runs", "--dry-run"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and re.fullmatch(
        r"hf-dpmerge push: error: task 'a' was trained on another base model: its privacy record's base_model_hash "
        r"sha256:\w+ does not match the merge's base runs/other_base sha256:\w+; .*--runs.*", errors[0]), errors
    assert not (workdir / "plain-hub").exists()


def test_merge_on_a_full_disk_names_the_output_and_leaves_nothing(workdir: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(workdir)

    def full_disk(self, shard_data: dict, shard_path: str) -> None:
        Path(shard_path).write_bytes(b"\x00" * 64)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(TensorWriter, "_save_st", full_disk)
    assert _merge(workdir, lora_config_yaml("dp_aware", "./runs/base", ADAPTERS)) == 2
    assert "error: [Errno 28] No space left on device while writing out" in capsys.readouterr().err


def test_merge_into_a_read_only_directory_names_it(workdir: Path, read_only_dir: Path, monkeypatch,
                                                   capsys) -> None:
    monkeypatch.chdir(workdir)
    out = str(read_only_dir / "merged")
    assert _merge(workdir, lora_config_yaml("dp_aware", "./runs/base", ADAPTERS), out=out) == 2
    assert re.search(rf"error: \[Errno (1|13)\] .*{re.escape(str(read_only_dir))}", capsys.readouterr().err)
    assert list(read_only_dir.iterdir()) == []


# ------------------------------------------------------------------------------------------ command line

REPO = Path(__file__).resolve().parents[2]


def command_line_mistakes() -> list[tuple[str, str]]:
    """(command, the stderr line's first excerpt) of every row of docs/bad-inputs.md's command-line table."""
    text = (REPO / "docs" / "bad-inputs.md").read_text()
    table = text.split("<!-- command-line-mistakes")[1].split("<!-- /command-line-mistakes -->")[0]
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)`", table, flags=re.MULTILINE)
    assert len(rows) >= 10, "docs/bad-inputs.md lost its command-line table"
    return rows


@pytest.mark.slow
@pytest.mark.parametrize(("command", "expected"), command_line_mistakes(), ids=lambda value: value[:60])
def test_command_line_mistakes_end_in_one_error_line(tmp_path: Path, command: str, expected: str) -> None:
    """Each documented mistake, run as a user types it: exit status 2, one `<prog>: error: …` line, no traceback."""
    for folder in ("examples", "merge_configs"):
        shutil.copytree(REPO / folder, tmp_path / folder)
    words = shlex.split(command)
    program = {"python": [sys.executable], "hf-dpmerge": [sys.executable, "-m", "hf_dpmerge.cli.main"]}[words[0]]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([*program, *words[1:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    errors = [line for line in done.stderr.splitlines() if ": error: " in line]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert len(errors) == 1 and errors[0].startswith(expected), done.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["examples", "merge_configs"]  # nothing written
