"""The default recipe fitted to the data size (hf_dpmerge/scripts/data_size.py), through train_glue.py's planning:
nothing is trained or written."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from hf_dpmerge.scripts.data_size import MIN_FITTED_STEPS
from hf_dpmerge.scripts.train import plan_runs


def plan(tmp_path: Path, rows: int, *flags: str):
    pd.DataFrame({"text": [f"note {i}" for i in range(rows)], "label": ["neg", "pos"] * (rows // 2)}).to_csv(
        tmp_path / "notes.csv", index=False)
    run = plan_runs(["--train_file", str(tmp_path / "notes.csv"), "--label_names", "neg,pos",
                     "--runs_dir", str(tmp_path / "runs"), *flags])["notes"]
    return run.data.splits["train"].num_rows, run.script, run.config


def test_a_small_dataset_fits_the_batches_and_the_encoder_steps_to_its_rows(tmp_path: Path) -> None:
    train_rows, script, config = plan(tmp_path, 1000)  # a tenth carved for validation, a fifth for test
    batch = int(2 / 3 * train_rows)
    assert config.per_device_train_batch_size == batch and script.head_phase_batch_size == batch
    assert config.physical_batch_size <= batch
    assert config.max_steps == math.ceil(75 * batch / 1024) < 75  # compute T·B falls with N
    assert config.learning_rate * config.max_steps == pytest.approx(1e-2 * 75)  # as far as the recipe's 75 steps
    assert config.head_learning_rate * config.max_steps == pytest.approx(1e-3 * 75)
    assert script.head_phase_steps == 1000  # the head phase on cached features keeps its steps
    assert not (tmp_path / "runs").exists()


def test_the_steps_never_fall_below_the_minimum(tmp_path: Path) -> None:
    _, _, config = plan(tmp_path, 200)
    assert config.max_steps == MIN_FITTED_STEPS


@pytest.mark.parametrize("flags, steps, rate", [(("--max_steps", "30"), 30, 1e-2),
                                               (("--per_device_train_batch_size", "64"), 75, 1e-2),
                                               (("--learning_rate", "3e-3"), 36, 3e-3)])
def test_what_the_user_sets_is_kept(tmp_path: Path, flags: tuple[str, ...], steps: int, rate: float) -> None:
    _, _, config = plan(tmp_path, 1000, *flags)
    assert (config.max_steps, config.learning_rate) == (steps, pytest.approx(rate))


def test_a_head_only_run_keeps_its_steps(tmp_path: Path) -> None:
    train_rows, _, config = plan(tmp_path, 1000, "--train_lora", "false")
    assert config.per_device_train_batch_size == int(2 / 3 * train_rows) and config.max_steps == 1000


def test_a_dataset_of_thousands_keeps_the_packaged_recipe(tmp_path: Path) -> None:
    _, script, config = plan(tmp_path, 2400)  # 1680 training rows: 2/3 of them exceed 1024
    assert (config.per_device_train_batch_size, config.max_steps, script.head_phase_batch_size) == (1024, 75, 1024)


def test_with_a_privacy_unit_column_the_units_set_the_batch(tmp_path: Path) -> None:
    rows = 600
    pd.DataFrame({"text": [f"visit {i}" for i in range(rows)], "label": ["neg", "pos"] * (rows // 2),
                  "patient": [f"p{i // 4}" for i in range(rows)]}).to_csv(tmp_path / "visits.csv", index=False)
    run = plan_runs(["--train_file", str(tmp_path / "visits.csv"), "--label_names", "neg,pos", "--privacy_unit_column",
                     "patient", "--runs_dir", str(tmp_path / "runs")])["visits"]
    train = run.data.splits["train"]
    units = len(set(train["patient"]))
    assert units < train.num_rows  # several visits per patient
    assert run.config.per_device_train_batch_size == int(2 / 3 * units)  # the expected number of patients per draw
