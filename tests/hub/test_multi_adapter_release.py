"""`hf-dpmerge push --multi_adapter`: the runs' base once and every task's adapter under ``<task>/``, staged from tiny
runs as training releases them, loaded by stock peft where ``import hf_dpmerge`` fails (one task, and a mixed batch
of the tasks whose heads have as many labels) to the logits of hf_dpmerge's own individual model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard

from hf_dpmerge.analysis.evaluation_report import EvaluationReport, TaskEvaluation
from hf_dpmerge.cli.main import main
from hf_dpmerge.data.tasks import TaskSpec
from hf_dpmerge.records.fingerprint import directory_fingerprint
from hf_dpmerge.records.release_files import is_release_file
from tests.utils.records import privacy_record
from tests.utils.stock_loading import SHARED_BASE, TEXTS, release_task_adapter
from tests.utils.tiny_models import save_tiny_bert, tiny_tokenizer

REPO_ID = "alice/dp-adapters"
TASKS = {"alpha": ("neg", "pos"), "beta": ("low", "mid", "high"), "gamma": ("no", "yes")}
HASHED = ["bert.encoder.layer.0.attention.self.query.weight", "bert.encoder.layer.1.attention.self.value.weight"]
_MARK = "@@multi-adapter@@ "
# stock peft only: one task, a mixed batch of the two 2-label tasks, and the 3-label head refused beside them
_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.modules["hf_dpmerge"] = None  # `import hf_dpmerge` raises ImportError from here on
    import torch
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    repo, texts = sys.argv[1], json.loads(sys.argv[2])
    batch = AutoTokenizer.from_pretrained(repo)(texts, padding=True, return_tensors="pt")
    answer = {}
    base = AutoModelForSequenceClassification.from_pretrained(repo, trust_remote_code=True,
                                                              id2label={0: "neg", 1: "pos"})
    model = PeftModel.from_pretrained(base, repo, subfolder="alpha", adapter_name="alpha").eval()
    model.load_adapter(repo, subfolder="gamma", adapter_name="gamma")
    with torch.no_grad():
        for task in ("alpha", "gamma"):
            model.set_adapter(task)
            answer[task] = model(**batch).logits.tolist()
        answer["mixed"] = model(**batch, adapter_names=["alpha", "gamma", "alpha"]).logits.tolist()
    try:
        model.load_adapter(repo, subfolder="beta", adapter_name="beta")
        answer["beta_beside"] = "loaded"
    except RuntimeError as err:
        answer["beta_beside"] = str(err)
    base = AutoModelForSequenceClassification.from_pretrained(repo, trust_remote_code=True,
                                                              id2label={0: "low", 1: "mid", 2: "high"})
    model = PeftModel.from_pretrained(base, repo, subfolder="beta", adapter_name="beta").eval()
    with torch.no_grad():
        answer["beta"] = model(**batch).logits.tolist()
    answer["beta_labels"] = model.config.id2label
    print("@@multi-adapter@@ " + json.dumps(answer))
    """
)


def _save_records(runs: Path, base: Path) -> None:
    """Each task's record, fingerprinting ``base`` as training does (the tensors its LoRA modifies)."""
    fingerprint = directory_fingerprint(base, HASHED)
    for task in TASKS:
        privacy_record(task, epsilon=2.0 + len(task), base_model="sentence-transformers/all-MiniLM-L6-v2",
                       base_model_hash=fingerprint, base_model_hash_tensors=HASHED,
                       extra={"label_names": list(TASKS[task])}).save(runs / task / "adapter")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """``root/runs``: a mean-pooling shared base and three adapters released as train_glue.py releases them."""
    root = tmp_path_factory.mktemp("multi")
    for seed, (task, labels) in enumerate(TASKS.items(), start=1):
        release_task_adapter(root, task=task, labels=labels, seed=seed)
    shutil.rmtree(root / "plain")  # the tiny BERT the base was built from: not part of the runs
    _save_records(root / "runs", root / SHARED_BASE)
    return root


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _individual_logits(root: Path, task: str) -> torch.Tensor:
    """The task's logits as ``hf-dpmerge evaluate`` computes its individual column."""
    from hf_dpmerge.analysis.task_models import load_individual_model

    labels = TASKS[task]
    spec = TaskSpec(task, len(labels), labels, ("text",), "accuracy", "packaged")
    model = load_individual_model(root / SHARED_BASE, root / "runs" / task / "adapter", spec)
    with torch.no_grad():
        return model(**tiny_tokenizer()(TEXTS, padding=True, return_tensors="pt")).logits


def _stock_answer(repo: str, cwd: Path, **env: str) -> dict:
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                   "HF_MODULES_CACHE": str(cwd / "modules"), **env}
    done = subprocess.run([sys.executable, "-c", _SCRIPT, repo, json.dumps(TEXTS)], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    answers = [line.split(_MARK, 1)[1] for line in done.stdout.splitlines() if _MARK in line]
    assert answers, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(answers[-1])


@pytest.fixture(scope="module")
def staged(trained) -> Path:
    """``hf-dpmerge push --multi_adapter --runs runs --dry-run`` run in the runs' parent folder."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(trained)
        assert main(["push", "--multi_adapter", "--runs", "runs", "--repo_id", REPO_ID, "--dry-run"]) == 0
    return trained / "multi-adapter-hub"


def test_the_staged_release_holds_the_base_once_and_each_adapter_as_released(trained, staged) -> None:
    files = _tree(staged)
    assert {"README.md", "config.json", "model.safetensors", "modeling_mean_pooling_bert.py", "tokenizer.json",
            *(f"{task}/{name}" for task in TASKS for name in ("adapter_config.json", "adapter_model.safetensors",
                                                              "dp_privacy.json"))} == set(files) - {
        ".hf_dpmerge-staging", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"}
    assert all(is_release_file(path) for path in files if path != ".hf_dpmerge-staging"), sorted(files)
    for task in TASKS:
        adapter = trained / "runs" / task / "adapter"
        for name in ("adapter_model.safetensors", "dp_privacy.json"):  # the released bytes, nothing recomputed
            assert files[f"{task}/{name}"] == (adapter / name).read_bytes()
        assert json.loads(files[f"{task}/adapter_config.json"])["base_model_name_or_path"] == REPO_ID
        assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == "."
    config = json.loads(files["config.json"])
    assert config["model_type"] == "mean_pooling_bert" and "shared_encoder_weights" not in config
    # nothing of the training machine: no path, no base marker, no classifier placeholder in the root weights
    assert not [path for path, content in files.items() if str(trained).encode() in content]
    from safetensors.torch import load

    assert not [key for key in load(files["model.safetensors"]) if key.startswith("classifier.")]


def test_the_card_states_each_tasks_guarantee_and_how_stock_peft_loads_the_tasks(staged) -> None:
    card = ModelCard.load(staged / "README.md")
    assert card.data.library_name == "peft" and "multi-adapter" in card.data.tags
    assert card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert card.data.base_model_relation == "adapter"
    text = card.text
    for task in TASKS:
        epsilon = f"{2.0 + len(task):.3g}"
        assert f"- `{task}`: **Guarantee: (ε = {epsilon}, δ = 1e-05)-DP**" in text
    assert "this is the guarantee of the whole release, every adapter in it" in text and "merged model's" not in text
    assert "that of the base this repository holds (checked when the release was staged)" in text
    assert f'PeftModel.from_pretrained(base, "{REPO_ID}", subfolder="alpha",' in text
    assert "id2label={0: 'neg', 1: 'pos'}" in text
    assert f'model.load_adapter("{REPO_ID}", subfolder="gamma", adapter_name="gamma")' in text
    assert 'adapter_names=["alpha", "gamma"]' in text and "2: `alpha`, `gamma`; 3: `beta`" in text


@pytest.mark.slow
def test_stock_peft_computes_each_tasks_individual_model_and_mixes_same_sized_heads(trained, staged,
                                                                                     tmp_path) -> None:
    """Each task's logits are hf_dpmerge's individual model's, a mixed batch's rows are their tasks' logits, and
    peft refuses a head of another size beside them (the limit the card states)."""
    answer = _stock_answer(str(staged), tmp_path)
    expected = {task: _individual_logits(trained, task) for task in TASKS}
    for task in TASKS:
        torch.testing.assert_close(torch.tensor(answer[task]), expected[task], atol=1e-5, rtol=0)
    rows = [expected["alpha"][0], expected["gamma"][1], expected["alpha"][2]]
    torch.testing.assert_close(torch.tensor(answer["mixed"]), torch.stack(rows), atol=1e-5, rtol=0)
    assert "size mismatch" in answer["beta_beside"]
    assert answer["beta_labels"] == {"0": "low", "1": "mid", "2": "high"}


def test_the_upload_holds_what_the_dry_run_stages(trained, staged, loopback_hub, monkeypatch, capsys) -> None:
    monkeypatch.chdir(trained)
    assert main(["push", "--multi_adapter", "--runs", "runs", "--repo_id", REPO_ID]) == 0
    repo = loopback_hub.repos[REPO_ID]
    assert repo.private and repo.commits[0]["summary"] == "Upload differentially private task adapters (hf_dpmerge)"
    assert repo.files == {k: v for k, v in _tree(staged).items() if not k.startswith(".")}
    assert f"to the private repository {REPO_ID}" in capsys.readouterr().out


def test_a_dry_run_writes_its_folder_only_and_replaces_only_its_own(trained, tmp_path, monkeypatch, capsys) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(trained / "runs", runs)
    before = _tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["push", "--multi_adapter", "--tasks", "alpha", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "Staged release in multi-adapter-hub" in out and "alpha/adapter_model.safetensors" in out
    assert "private repository your-username/dp-adapters" in out
    after = _tree(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("multi-adapter-hub/")} == before
    assert not (tmp_path / "multi-adapter-hub" / "gamma").exists()
    assert main(["push", "--multi_adapter", "--tasks", "gamma", "--dry-run"]) == 0  # its own folder: replaced
    folder = tmp_path / "multi-adapter-hub"
    assert (folder / "gamma").is_dir() and not (folder / "alpha").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert main(["push", "--multi_adapter", "--dry-run", "--staging_dir", "mine"]) == 2
    assert "holds no previous hf-dpmerge push staging" in capsys.readouterr().err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    assert main(["push", "--multi_adapter", "--dry-run", "--staging_dir", "runs/hub"]) == 2
    assert "must lie outside runs, which the release is made from" in capsys.readouterr().err


def test_adapters_trained_on_another_base_are_refused(trained, tmp_path, capsys) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(trained / "runs", runs)
    shutil.rmtree(runs / "base")
    save_tiny_bert(runs / "base", seed=1)
    assert main(["push", "--multi_adapter", "--runs", str(runs), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "task 'alpha' was trained on another base model" in err and "does not match the released base" in err
    assert not (tmp_path / "multi-adapter-hub").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["push", "--dry-run"], "MERGED_DIR is required (the mergekit-yaml output to release), or pass --multi_adapter"),
    (["push", "merged", "--multi_adapter", "--dry-run"], "--multi_adapter releases the runs' adapters unmerged"),
    (["push", "--multi_adapter", "--merge_config", "m.yaml", "--dry-run"], "--merge_config quotes a merge"),
])
def test_the_mode_is_asked_for_clearly(argv, message, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert message in capsys.readouterr().err and not any(tmp_path.iterdir())


def test_evaluate_names_the_multi_adapter_release_as_the_individual_column() -> None:
    report = EvaluationReport([TaskEvaluation("alpha", "accuracy", 8.0, 1e-5, 0.9, 0.85, 10, floor=0.8)],
                              merged_model="merged", base_model="runs/base")
    legend = report.definitions()["individual"]
    assert "hf-dpmerge push --multi_adapter" in legend and "lossless" in legend
    assert f"individual: {legend}" in report.table()
    assert report.to_dict()["definitions"]["individual"] == legend
