"""A tiny training run prints no warning from the project's own calls: no Python warning of any source, and no
transformers load report for the heads it creates on purpose."""

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
