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
def test_the_quick_start_and_the_full_run_on_tiny_settings(tmp_path):
    """examples/quickstart.sh (the README's quick start) end to end on a tiny model: rotten_tomatoes trained, a
    released election_tweets (adapter and head, trained here on the same tiny base into examples/released/) merged
    beside it; then examples/full_run.sh training both tasks of a trimmed dp.yaml, merged as one adapter."""
    base_model = save_tiny_bert(tmp_path / "tiny-base")
    project = tmp_path / "project"
    for folder in ("examples", "merge_configs"):
        shutil.copytree(REPO / folder, project / folder)
    released = project / "examples" / "released"
    shutil.rmtree(released)
    tiny = ["--model_name_or_path", str(base_model), *TINY_TRAINING]
    for runs, flags in (("runs", []), ("runs_floor", ["--train_lora", "false"])):
        run([sys.executable, "examples/train_glue.py", "--tasks", "election_tweets", "--runs_dir",
             str(released / runs), *flags, *tiny], cwd=project)
    done = run(["bash", "examples/quickstart.sh", *tiny], cwd=project)
    assert "retention" in done.stdout and "average" in done.stdout  # the printed table
    results = json.loads((project / "runs" / "eval" / "results.json").read_text())
    assert sorted(results["tasks"]) == ["election_tweets", "rotten_tomatoes"]
    assert results["floor_kind"] == "private_head" and "own head" in done.stdout  # the floor: runs_floor's heads
    for runs in ("runs", "runs_floor"):  # the released task as released, beside the one trained here
        assert (project / runs / "election_tweets" / "adapter" / "dp_privacy.json").read_bytes() == (
            released / runs / "election_tweets" / "adapter" / "dp_privacy.json").read_bytes()
        assert (project / runs / "rotten_tomatoes" / "adapter" / "dp_privacy.json").is_file()
    card = (project / "merged-hub" / "README.md").read_text()
    assert "rotten_tomatoes" in card and "election_tweets" in card and "-DP" in card
    staged = project / "merged-hub"
    assert (staged / "model.safetensors").is_file()  # the merged encoder, once
    assert (staged / "election_tweets" / "head.safetensors").is_file()  # the task's head, its folder loads the encoder
    assert not (staged / "election_tweets" / "model.safetensors").exists()
    assert json.loads((staged / "election_tweets" / "config.json").read_text())["num_labels"] == 2
    # a second run refuses to overwrite the merged model it made
    again = subprocess.run(["bash", "examples/quickstart.sh"], cwd=project, capture_output=True, text=True)
    assert again.returncode == 1 and "merged already exists" in again.stderr
    # the full run: the tasks trained here only, merged in factor space into one peft adapter (no evaluate, push)
    trim_merge_config(project / "merge_configs" / "dp.yaml")
    adapter = run(["bash", "examples/full_run.sh", "--overwrite", *tiny], cwd=project, TASKS=TASKS, AS_ADAPTER="1",
                  MERGED="merged-adapter")
    assert "merged adapter written to merged-adapter" in adapter.stdout and "retention" not in adapter.stdout
    written = sorted(p.name for p in (project / "merged-adapter").iterdir())
    assert written == ["README.md", "adapter_config.json", "adapter_merge.json", "adapter_model.safetensors",
                       "mergekit_config.yml"]
    assert json.loads((project / "runs" / "bbc_news" / "adapter" / "dp_privacy.json").read_text())["task"] == "bbc_news"
