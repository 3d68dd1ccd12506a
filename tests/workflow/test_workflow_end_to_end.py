"""The README flow on tiny settings: train_glue.py → mergekit-yaml → hf-dpmerge evaluate / diagnose → push --dry-run."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hf_dpmerge import PrivacyRecord
from hf_dpmerge.cli.main import main as hf_dpmerge
from tests.utils.subprocess_helpers import run_offline as run
from tests.utils.tiny_models import save_tiny_bert

REPO = Path(__file__).resolve().parents[2]
TASKS = "rotten_tomatoes,bbc_news"
TINY_TRAINING = ["--max_train_samples", "96", "--max_eval_samples", "32", "--per_device_train_batch_size", "16",
                 "--physical_batch_size", "8", "--max_steps", "3", "--lora_r", "2", "--accountant", "rdp",
                 "--head_phase_steps", "3", "--head_phase_batch_size", "16"]  # LP-FT's head phase (the default)


def trim_merge_config(path: Path) -> None:
    """Keep the plan's entries for the two tasks trained here."""
    lines = path.read_text().splitlines()
    kept = [line for line in lines if not any(t in line for t in ("election_tweets", "reuters_r8"))]
    path.write_text("\n".join(kept) + "\n")


@pytest.mark.slow
def test_readme_flow_on_tiny_settings(tmp_path, monkeypatch):
    """The README's commands; evaluate, diagnose and push run in this process (the main command's test below runs
    the ``hf-dpmerge`` console script)."""
    base_model = save_tiny_bert(tmp_path / "tiny-base")
    shutil.copytree(REPO / "merge_configs", tmp_path / "merge_configs")
    run([sys.executable, str(REPO / "examples" / "train_glue.py"), "--tasks", TASKS,
         "--model_name_or_path", str(base_model), *TINY_TRAINING], cwd=tmp_path)
    for task in TASKS.split(","):
        record = PrivacyRecord.load(tmp_path / "runs" / task / "adapter")
        assert record.task == task and record.steps == 3 and 0 < record.epsilon <= 8.0
        assert PrivacyRecord.load(tmp_path / "runs" / task / "encoder_adapter").epsilon == record.epsilon
        metrics = json.loads((tmp_path / "runs" / task / "eval_metrics.json").read_text())
        assert 0.0 <= metrics["test"]["accuracy"] <= 1.0

    trim_merge_config(tmp_path / "merge_configs" / "dp.yaml")
    run(["mergekit-yaml", "merge_configs/dp.yaml", "merged", "--lora-merge-cache", "runs/lora-cache"], cwd=tmp_path)
    assert (tmp_path / "merged" / "config.json").exists()

    monkeypatch.chdir(tmp_path)
    assert hf_dpmerge(["evaluate", "--runs", "runs", "--merged", "merged", "--tasks", TASKS,
                       "--output", "runs/eval", "--max_eval_samples", "32"]) == 0
    results = json.loads((tmp_path / "runs" / "eval" / "results.json").read_text())
    assert set(results["tasks"]) == set(TASKS.split(","))

    assert hf_dpmerge(["diagnose", "--runs", "runs", "--merged", "merged", "--tasks", TASKS, "--max-samples", "16",
                       "--hessian-iterations", "2", "--gammas", "0.5", "--output-dir", "runs/diagnostics"]) == 0
    diagnostics = json.loads((tmp_path / "runs" / "diagnostics" / "diagnostics.json").read_text())
    assert set(diagnostics["tasks"]) == set(TASKS.split(","))
    for row in diagnostics["tasks"].values():
        assert row["interpolation"]["gamma"] == [0.0, 0.5, 1.0] and row["drift"] > 0
        assert None not in (row["sharpness"], row["hessian_top_eigenvalue"], row["merge_gap"])
    assert (tmp_path / "runs" / "diagnostics" / "interpolation.png").is_file()

    assert hf_dpmerge(["push", "merged", "--repo_id", "me/tiny", "--runs", "runs", "--tasks", TASKS,
                       "--eval_json", "runs/eval/results.json", "--dry-run", "--staging_dir", "staged"]) == 0
    card = (tmp_path / "staged" / "README.md").read_text()
    assert "rotten_tomatoes" in card and "-DP" in card


@pytest.mark.slow
def test_main_command_script_on_tiny_settings(tmp_path):
    """examples/quickstart.sh (the README's main command) end to end, on a tiny model and two tasks."""
    base_model = save_tiny_bert(tmp_path / "tiny-base")
    project = tmp_path / "project"
    for folder in ("examples", "merge_configs"):
        shutil.copytree(REPO / folder, project / folder)
    trim_merge_config(project / "merge_configs" / "dp.yaml")
    done = run(["bash", "examples/quickstart.sh", "--model_name_or_path", str(base_model), *TINY_TRAINING],
               cwd=project, TASKS=TASKS)
    assert "retention" in done.stdout and "average" in done.stdout  # the printed table
    results = json.loads((project / "runs" / "eval" / "results.json").read_text())
    assert set(results["tasks"]) == set(TASKS.split(","))
    assert results["floor_kind"] == "private_head" and "own head" in done.stdout  # the floor: runs_floor's heads
    assert all((project / "runs_floor" / task / "adapter" / "dp_privacy.json").is_file() for task in TASKS.split(","))
    card = (project / "merged-hub" / "README.md").read_text()
    assert "rotten_tomatoes" in card and "bbc_news" in card and "-DP" in card
    staged = project / "merged-hub"
    assert (staged / "model.safetensors").is_file()  # the merged encoder, once
    assert (staged / "bbc_news" / "head.safetensors").is_file()  # the task's head, its folder loads the encoder
    assert not (staged / "bbc_news" / "model.safetensors").exists()
    assert json.loads((project / "merged-hub" / "bbc_news" / "config.json").read_text())["num_labels"] == 5
    # a second run refuses to overwrite the merged model it made
    again = subprocess.run(["bash", "examples/quickstart.sh"], cwd=project, capture_output=True, text=True)
    assert again.returncode == 1 and "merged already exists" in again.stderr
    # AS_ADAPTER=1: the same training, merged in factor space into one peft adapter (no evaluate, no push)
    adapter = run(["bash", "examples/quickstart.sh", "--overwrite", "--model_name_or_path", str(base_model),
                   *TINY_TRAINING], cwd=project, TASKS=TASKS, AS_ADAPTER="1", MERGED="merged-adapter")
    assert "merged adapter written to merged-adapter" in adapter.stdout and "retention" not in adapter.stdout
    written = sorted(p.name for p in (project / "merged-adapter").iterdir())
    assert written == ["README.md", "adapter_config.json", "adapter_merge.json", "adapter_model.safetensors",
                       "mergekit_config.yml"]
