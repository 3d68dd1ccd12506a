"""A tiny training run prints no warning from the project's own calls (no Python warning of any source, no
transformers load report for the heads it creates on purpose), and neither does a merge into task folders."""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd

from hf_dpmerge.scripts.train import main
from tests.utils.tiny_models import save_tiny_bert


def test_a_tiny_own_data_run_warns_of_nothing(tmp_path: Path, monkeypatch, capfd) -> None:
    monkeypatch.chdir(tmp_path)
    save_tiny_bert(tmp_path / "tiny")
    pd.DataFrame({"text": [f"note {i} {'good' if i % 2 else 'bad'}" for i in range(150)],
                  "label": ["neg", "pos"] * 75}).to_csv("notes.csv", index=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(["--train_file", "notes.csv", "--label_names", "neg,pos", "--model_name_or_path", "tiny",
              "--max_steps", "2", "--max_length", "16", "--disable_tqdm", "true"])
    assert [f"{w.category.__name__}: {w.message}" for w in caught] == []
    printed = capfd.readouterr()
    assert "LOAD REPORT" not in printed.out + printed.err and "MISSING" not in printed.out + printed.err
    assert (tmp_path / "runs" / "notes" / "adapter" / "dp_privacy.json").is_file()


def test_a_merge_into_task_folders_reports_nothing_it_caused(merge_runs, tmp_path: Path) -> None:
    """``hf-dpmerge merge`` (as a user runs it) re-creates each task's head on the merged encoder, then replaces it,
    and renders its card section without a metadata block: neither is reported."""
    from tests.utils.merging_builders import lora_config_yaml
    from tests.utils.subprocess_helpers import run_offline

    runs = merge_runs({"topics": 3, "sentiment": 2})
    (runs.parent / "merge.yaml").write_text(lora_config_yaml(
        "task_arithmetic", "./runs/base", ["./runs/topics/encoder_adapter", "./runs/sentiment/encoder_adapter"],
        "parameters:\n  weight: 1.0\n  lambda: 0.5\n"))
    done = run_offline(["hf-dpmerge", "merge", "merge.yaml", str(tmp_path / "merged"), "--lora-merge-cache", "cache",
                        "--quiet"], cwd=runs.parent)
    assert (tmp_path / "merged" / "topics" / "config.json").is_file()  # a task folder was written
    assert "LOAD REPORT" not in done.stdout + done.stderr and "MISMATCH" not in done.stdout + done.stderr
    assert "metadata block was not found" not in done.stderr
