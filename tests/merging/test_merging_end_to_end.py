"""End to end: the literal ``mergekit-yaml`` and ``hf-dpmerge merge`` on tiny saved models and adapters."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSequenceClassification

from hf_dpmerge.cli.main import main
from hf_dpmerge.records.record import PRIVACY_RECORD_NAME, PrivacyRecord
from tests.utils.merging_builders import full_config_yaml, lora_config_yaml, save_variant

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TASKS = {"rotten_tomatoes": 2, "election_tweets": 3, "reuters_r8": 8, "bbc_news": 5}
ADAPTERS = [f"./runs/{task}/encoder_adapter" for task in TASKS]


@pytest.fixture(scope="module")
def workdir(merge_runs) -> Path:
    """A directory laid out like the training example's output, plus three full-model variants."""
    root = merge_runs(TASKS).parent
    for seed in (1, 2, 3):
        save_variant(root / "runs" / "base", root / "full" / f"v{seed}", seed)
    return root


def _mergekit_yaml(workdir: Path, config: str, out: str) -> subprocess.CompletedProcess[str]:
    (workdir / "config.yaml").write_text(config)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO / "mergekit_hook"), str(REPO)])}  # this repository's hook
    script = Path(sys.executable).with_name("mergekit-yaml")
    return subprocess.run(
        [str(script), "config.yaml", out, "--lora-merge-cache", "cache", "--quiet"],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=300,
    )


def _assert_merged(workdir: Path, out: str, expect_changed: str, privacy_card: bool = False) -> None:
    model, loading = AutoModelForSequenceClassification.from_pretrained(workdir / out, output_loading_info=True)
    merged = model.state_dict()
    base = AutoModelForSequenceClassification.from_pretrained(workdir / "runs" / "base").state_dict()
    if privacy_card:  # hf-dpmerge merge: the root is the merged encoder, no head (each task's is in <task>/)
        assert set(loading["missing_keys"]) == {"classifier.weight", "classifier.bias"}  # reported, not silent
        assert not [k for k in load_file(workdir / out / "model.safetensors") if k.startswith("classifier.")]
        merged = {k: v for k, v in merged.items() if not k.startswith("classifier.")}
        note = json.loads((workdir / out / "config.json").read_text())["hf_dpmerge_merged_encoder"]
        folders = sorted(p.parent.name for p in (workdir / out).glob("*/config.json"))
        assert folders and sorted(note["tasks"]) == folders and "subfolder='<task>'" in note["note"]
    changed = [name for name, tensor in merged.items() if not torch.equal(tensor, base[name])]
    assert changed and all(expect_changed in name for name in changed), changed
    assert all(bool(torch.isfinite(tensor).all()) for tensor in merged.values())
    readme = (workdir / out / "README.md").read_text()
    if privacy_card:  # hf-dpmerge merge adds it; plain mergekit-yaml writes mergekit's own card
        assert "## Differential privacy" in readme and "(ε = 8, δ = 1e-05)-DP" in readme


@pytest.mark.parametrize("method", ["dp_aware", "cauchy_poe", "tsv", "iso_c", "iso_cts", "wudi"])
def test_mergekit_yaml_merges_lora_adapters(workdir: Path, method: str) -> None:
    steps = "  steps: 20\n" if method == "wudi" else ""  # the mergekit path; 300 steps: test_merging_spectral.py
    config = lora_config_yaml(method, "./runs/base", ADAPTERS, f"parameters:\n  lambda: 0.5\n{steps}")
    result = _mergekit_yaml(workdir, config, f"out_lora_{method}")
    assert result.returncode == 0, result.stderr[-3000:]
    _assert_merged(workdir, f"out_lora_{method}", expect_changed=".attention.self.")  # query/value only


@pytest.mark.parametrize("method", ["dp_aware", "cauchy_poe"])
def test_mergekit_yaml_merges_full_models(workdir: Path, method: str) -> None:
    config = full_config_yaml(method, "./runs/base", ["./full/v1", "./full/v2", "./full/v3"])
    result = _mergekit_yaml(workdir, config, f"out_full_{method}")
    assert result.returncode == 0, result.stderr[-3000:]
    _assert_merged(workdir, f"out_full_{method}", expect_changed="")


def test_mergekit_yaml_dp_aware_refuses_an_input_without_a_record(workdir: Path) -> None:
    config = lora_config_yaml("dp_aware", "./runs/base", [ADAPTERS[0], _broken_adapter(workdir, "no_record")])
    result = _mergekit_yaml(workdir, config, "out_no_record")
    assert result.returncode != 0
    assert "is not shown to be differentially private (it has no dp_privacy.json)" in result.stderr


@pytest.mark.parametrize("name", ["dp", "cauchy_poe", "task_arithmetic", "ties", "negation", "safe_merge"])
def test_shipped_merge_configs_run_on_the_training_layout(workdir: Path, name: str, monkeypatch) -> None:
    monkeypatch.chdir(workdir)
    out = workdir / "merged" / name
    assert main(["merge", str(REPO / "merge_configs" / f"{name}.yaml"), str(out),
                 "--lora-merge-cache", "runs/lora_cache", "--quiet"]) == 0
    _assert_merged(workdir, f"merged/{name}", expect_changed=".attention.self.", privacy_card=True)
    assert sorted(p.name for p in out.parent.iterdir() if p.name.startswith(".")) == []  # no scratch left


def test_cli_replaces_only_a_previous_merge_and_only_with_overwrite(workdir: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(workdir)
    config = REPO / "merge_configs" / "task_arithmetic.yaml"

    def merge(out: Path, *flags: str) -> int:
        return main(["merge", str(config), str(out), *flags, "--lora-merge-cache", "runs/lora_cache", "--quiet"])

    occupied = workdir / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("mine")
    assert merge(occupied) == 2 and "pass --overwrite" in capsys.readouterr().err
    assert merge(occupied, "--overwrite") == 2 and "holds no previous merge" in capsys.readouterr().err
    assert sorted(p.name for p in occupied.iterdir()) == ["keep.txt"]

    previous = workdir / "previous"
    assert merge(previous) == 0
    (previous / "stale.txt").write_text("from the first merge")
    assert merge(previous) == 2 and "pass --overwrite" in capsys.readouterr().err
    assert merge(previous, "--overwrite") == 0
    assert not (previous / "stale.txt").exists() and (previous / "model.safetensors").exists()


def _broken_adapter(workdir: Path, name: str) -> str:
    target = workdir / "broken" / name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(workdir / "runs" / "rotten_tomatoes" / "encoder_adapter", target)
    weights_file = target / "adapter_model.safetensors"
    if name == "other_base":
        record = PrivacyRecord.load(target)
        record.base_model_hash = "sha256:" + "1" * 64
        record.save(target)
    elif name in ("nan", "shape"):
        weights = load_file(weights_file)
        key = next(k for k in weights if ".lora_B." in k)
        weights[key] = torch.full_like(weights[key], float("nan")) if name == "nan" else torch.zeros(5, 4)
        save_file(weights, weights_file)
    elif name == "no_record":
        (target / PRIVACY_RECORD_NAME).unlink()
    elif name == "corrupt_record":
        (target / PRIVACY_RECORD_NAME).write_text('{"schema_version": 1, "epsilon": ')
    return f"./broken/{name}"


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        ("missing", "does not exist"),
        ("other_base", "trained on another base model"),
        ("shape", "LoRA delta of shape"),
        ("nan", "NaN or infinite"),
        ("no_record", "no dp_privacy.json"),
        ("corrupt_record", "corrupt privacy record"),
        ("misspelt", "did you mean 'weight'"),
    ],
)
def test_bad_inputs_fail_clearly_without_output(workdir: Path, broken: str, message: str, monkeypatch,
                                                capsys) -> None:
    monkeypatch.chdir(workdir)
    adapter = "./broken/missing" if broken in ("missing", "misspelt") else _broken_adapter(workdir, broken)
    per_model = "    parameters:\n      wieght: 0.5\n" if broken == "misspelt" else ""
    adapters = ADAPTERS[:2] if broken == "misspelt" else [ADAPTERS[0], adapter]
    (workdir / "bad.yaml").write_text(lora_config_yaml("dp_aware", "./runs/base", adapters, per_model=per_model))
    out = workdir / "bad_out"
    assert main(["merge", "bad.yaml", str(out), "--lora-merge-cache", "cache", "--quiet"]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists() and not [p for p in workdir.iterdir() if p.name.startswith(".bad_out")]


def test_merged_task_folders_give_evaluates_logits_through_stock_transformers(workdir: Path, monkeypatch,
                                                                              tmp_path: Path) -> None:
    from hf_dpmerge.analysis.task_models import load_merged_with_head
    from hf_dpmerge.data import get_task_spec
    from tests.utils.stock_loading import TEXTS, load_without_hf_dpmerge
    from tests.utils.tiny_models import tiny_tokenizer

    monkeypatch.chdir(workdir)
    out = workdir / "merged" / "stock"
    assert main(["merge", str(REPO / "merge_configs" / "dp.yaml"), str(out), "--lora-merge-cache", "runs/lora_cache",
                 "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == sorted(TASKS)
    spec = get_task_spec("reuters_r8")
    model = load_merged_with_head(out, workdir / "runs" / "reuters_r8" / "adapter", spec).eval()
    with torch.no_grad():
        expected = model(**tiny_tokenizer()(TEXTS, padding=True, return_tensors="pt")).logits
    answer = load_without_hf_dpmerge("auto", out, "reuters_r8", HF_MODULES_CACHE=str(tmp_path))
    assert "error" not in answer, answer
    torch.testing.assert_close(torch.tensor(answer["logits"]), expected, atol=1e-5, rtol=0)
    assert list(answer["id2label"].values()) == list(spec.label_names)
