"""Your own data end to end, as a user runs it: the own-data mistakes of docs/bad-inputs.md (exit 2, one line,
nothing written), and two own datasets plus a packaged task trained from one base, merged, evaluated and
staged; the same from the Python API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pandas as pd
import pytest

from hf_dpmerge.records.record import PrivacyRecord
from tests.utils.subprocess_helpers import REPO, run_offline
from tests.utils.tiny_models import save_tiny_bert

pytestmark = pytest.mark.slow

TINY = ["--max_steps", "2", "--max_length", "16", "--logging_steps", "1", "--per_device_eval_batch_size", "32"]


def notes(n: int, labels: tuple = ("neg", "pos")) -> pd.DataFrame:
    return pd.DataFrame({"text": [f"note {i} {'good' if i % 2 else 'bad'}" for i in range(n)],
                         "label": [labels[i % len(labels)] for i in range(n)]})


def write_mistakes(root: Path) -> list[tuple[list[str], str]]:
    """(train_glue.py flags, what the one error line must say) for each own-data mistake."""
    notes(150).to_csv(root / "good.csv", index=False)
    notes(150).rename(columns={"text": "body"}).to_csv(root / "body.csv", index=False)
    (root / "notes.txt").write_text("text,label\nhello,pos\n")
    empty = notes(150)
    empty.loc[[4, 9], "text"] = ""
    empty.to_csv(root / "empty.csv", index=False)
    notes(150).assign(label=[0.5, 1.0] * 75).to_csv(root / "float.csv", index=False)
    rare = notes(150)
    rare.loc[11, "label"] = "RARE-DIAGNOSIS-X17"
    rare.to_csv(root / "rare.csv", index=False)
    (root / "latin1.csv").write_bytes("text,label\ncafé crème,pos\n".encode("latin-1"))
    (root / "dupe.csv").write_text("text,text,label\na,b,pos\n")
    notes(50).to_csv(root / "small.csv", index=False)
    names = ["--label_names", "neg,pos"]
    return [
        (["--train_file", "missing.csv", *names], "missing.csv: no such file"),
        (["--train_file", "notes.txt", *names], "unsupported extension '.txt'"),
        (["--train_file", "body.csv", *names], "--text_column text: no such column in the train split (columns "
                                               "found: body, label)"),
        (["--train_file", "good.csv", "--label_column", "y", *names], "--label_column y: no such column"),
        (["--train_file", "empty.csv", *names], "2 row(s) whose 'text' is empty or null"),
        (["--train_file", "float.csv", "--label_names", "a,b"], "fractional numbers"),
        (["--train_file", "good.csv", "--label_names", "pos"], "at least two classes"),
        (["--train_file", "rare.csv", *names], "1 row(s) whose label is not one of the 2 label names"),
        (["--train_file", "good.csv"], "the label set is part of the release"),
        (["--train_file", "good.csv", "--privacy_unit_column", "patient", *names],
         "--privacy_unit_column patient: no such column"),
        (["--train_file", "latin1.csv", *names], "not UTF-8 text"),
        (["--train_file", "dupe.csv", *names], "column 'text' appears more than once"),
        (["--dataset_name", "someone/private-notes", *names], "--dataset_name someone/private-notes: not a local "
                                                              "folder and not loadable from the Hub"),
        (["--task", "bbc_news", "--train_file", "good.csv", *names], "--task names a packaged or GLUE task"),
        (["--train_file", "small.csv", *names], "the default recipe needs at least 100 privacy units"),
    ]


SUBPROCESS_CASES = ("missing.csv", "someone/private-notes")  # the script itself, and the Hub offline


def test_each_own_data_mistake_ends_in_one_line_and_writes_nothing(tmp_path: Path, monkeypatch, capsys) -> None:
    """Each mistake through train_glue.py's own entry (``run_script(main)``): in this process, and two of them as a
    user runs the script, in a subprocess."""
    from hf_dpmerge.scripts.train import main as train_main
    from hf_dpmerge.utils.user_errors import run_script

    cases = write_mistakes(tmp_path)
    assert len(cases) >= 12
    monkeypatch.chdir(tmp_path)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    for flags, expected in cases:
        argv = [*flags, "--runs_dir", "runs"]
        if any(name in flags for name in SUBPROCESS_CASES):
            done = subprocess.run([sys.executable, str(REPO / "examples" / "train_glue.py"), *argv], cwd=tmp_path,
                                  env=env, capture_output=True, text=True, timeout=300)
            status, stderr = done.returncode, done.stderr
        else:
            monkeypatch.setattr(sys, "argv", ["train_glue.py", *argv])
            with pytest.raises(SystemExit) as exited:
                run_script(train_main)
            status, stderr = exited.value.code, capsys.readouterr().err
        lines = stderr.strip().splitlines()
        assert status == 2 and len(lines) == 1, (flags, stderr[-2000:])
        assert lines[0].startswith("train_glue.py: error: ") and expected in lines[0], (flags, lines[0])
        assert "RARE-DIAGNOSIS" not in lines[0] and "café" not in lines[0]
    assert not (tmp_path / "runs").exists()


def test_own_datasets_and_a_packaged_task_train_merge_evaluate_and_stage(tmp_path: Path) -> None:
    model = save_tiny_bert(tmp_path / "tiny")
    notes(1000).to_csv(tmp_path / "reviews.csv", index=False)
    notes(300, ("low", "mid", "high")).to_json(tmp_path / "clinic.jsonl", orient="records", lines=True)
    script = [sys.executable, str(REPO / "examples" / "train_glue.py"), "--model_name_or_path", str(model), *TINY]
    run_offline([*script, "--train_file", "reviews.csv", "--label_names", "neg,pos"], cwd=tmp_path)
    run_offline([*script, "--train_file", "clinic.jsonl", "--label_names", "low,mid,high", "--task_name", "clinic"],
                cwd=tmp_path)
    run_offline([*script, "--task", "bbc_news", "--max_train_samples", "200", "--max_eval_samples", "40"],
                cwd=tmp_path)
    record = PrivacyRecord.load(tmp_path / "runs" / "clinic" / "adapter")
    assert record.extra["label_names"] == ["low", "mid", "high"]
    assert record.extra["label_names_from"] == "--label_names"
    assert record.extra["carved_splits"] == ["validation", "test"]
    assert record.expected_batch_size == int(2 / 3 * record.num_samples)  # the default fitted to N = 216 rows
    assert [phase["steps"] for phase in record.extra["phases"]] == [2, 2]  # --max_steps bounds both phases
    released = "".join(p.read_text(errors="ignore") for p in (tmp_path / "runs" / "clinic" / "adapter").rglob("*")
                       if p.is_file())
    assert str(tmp_path) not in released  # the data's path stays beside the release (dataset.json), never in it

    (tmp_path / "merge.yaml").write_text(
        "merge_method: task_arithmetic\nbase_model: ./runs/base\nmodels:\n"
        + "".join(f"  - model: ./runs/base+./runs/{task}/encoder_adapter\n" for task in ("reviews", "clinic",
                                                                                        "bbc_news"))
        + "dtype: float32\nparameters:\n  weight: 1.0\n  lambda: 0.5\n")
    run_offline(["hf-dpmerge", "merge", "merge.yaml", "merged", "--lora-merge-cache", "runs/cache"], cwd=tmp_path)
    run_offline(["hf-dpmerge", "evaluate", "--runs", "runs", "--merged", "merged", "--output", "runs/eval"],
                cwd=tmp_path)
    results = json.loads((tmp_path / "runs" / "eval" / "results.json").read_text())
    assert set(results["tasks"]) == {"reviews", "clinic", "bbc_news"}
    run_offline(["hf-dpmerge", "push", "merged", "--runs", "runs", "--eval_json", "runs/eval/results.json",
                 "--dry-run"], cwd=tmp_path)
    staged = tmp_path / "merged-hub" / "clinic" / "config.json"
    assert json.loads(staged.read_text())["id2label"] == {
        "0": "low", "1": "mid", "2": "high"}


def test_the_python_api_trains_a_dataset_in_memory_into_the_runs_layout(tmp_path: Path, monkeypatch) -> None:
    from hf_dpmerge import train_adapter

    monkeypatch.chdir(tmp_path)
    rows = datasets.Dataset.from_pandas(notes(300))
    adapter = train_adapter(rows, "clinic", label_names=["neg", "pos"], runs_dir="runs",
                            model_name_or_path=str(save_tiny_bert(tmp_path / "tiny")), max_steps=2, max_length=16)
    assert adapter.adapter_dir == Path("runs/clinic/adapter") and adapter.encoder_adapter_dir.is_dir()
    assert adapter.record.epsilon <= 8 and "accuracy" in adapter.test_metrics
    with pytest.raises(FileExistsError):  # a release is never replaced unasked
        train_adapter(rows, "clinic", label_names=["neg", "pos"], runs_dir="runs")
    with pytest.raises(ValueError, match="at least two classes"):  # checked before anything is written
        train_adapter(rows, "other", label_names=["neg"], runs_dir="runs")
    assert not Path("runs/other").exists()
    assert Path("runs/clinic/dataset.json").is_file() and datasets.load_from_disk("runs/clinic/data")["train"].num_rows

    tiny = {"model_name_or_path": str(tmp_path / "tiny"), "max_steps": 2, "max_length": 16}
    visits = datasets.Dataset.from_pandas(notes(200, ("low", "high")))
    train_adapter(visits, "visits", label_names=["low", "high"], runs_dir="runs", **tiny)
    for task, data, labels in (("clinic", rows, ["neg", "pos"]), ("visits", visits, ["low", "high"])):
        floor = train_adapter(data, task, label_names=labels, runs_dir="runs_floor", train_lora=False, **tiny)
        assert floor.record.extra["train_lora"] is False and floor.record.epsilon <= 8  # the private head
    Path("merge.yaml").write_text(
        "merge_method: task_arithmetic\nbase_model: ./runs/base\nmodels:\n"
        + "".join(f"  - model: ./runs/base+./runs/{task}/encoder_adapter\n" for task in ("clinic", "visits"))
        + "dtype: float32\nparameters:\n  weight: 1.0\n  lambda: 0.5\n")
    run_offline(["hf-dpmerge", "merge", "merge.yaml", "merged", "--lora-merge-cache", "runs/cache"], cwd=tmp_path)
    run_offline(["hf-dpmerge", "evaluate", "--runs", "runs", "--merged", "merged", "--floor_runs", "runs_floor"],
                cwd=tmp_path)
    results = json.loads(Path("runs/eval/results.json").read_text())
    assert set(results["tasks"]) == {"clinic", "visits"}
    assert all(results["tasks"][task]["floor"] is not None for task in ("clinic", "visits"))
