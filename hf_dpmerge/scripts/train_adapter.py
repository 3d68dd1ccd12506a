"""``train_adapter``: a private adapter from a ``datasets.Dataset`` already in memory, released into the runs layout.

It is ``examples/train_glue.py --dataset_name`` on a copy of the rows: the dataset is checked in memory, then saved
with ``save_to_disk`` to ``<runs_dir>/<task_name>/data/`` (beside the release, never inside it: ``evaluate`` and
``tune`` read the same rows from there), then trained with the script's defaults and any flag given as a keyword
(``target_epsilon=4``, ``max_steps=3``…), so ``merge``, ``evaluate`` and ``push`` take the result unchanged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from hf_dpmerge.data.dataset_source import DatasetSource
from hf_dpmerge.data.own_data import own_task
from hf_dpmerge.records.record import PrivacyRecord
from hf_dpmerge.records.release_files import check_release_target
from hf_dpmerge.records.run_folders import ADAPTER_DIR, ENCODER_ADAPTER_DIR
from hf_dpmerge.utils.io import staged_directory

DATA_DIR = "data"


@dataclass(frozen=True)
class TrainedAdapter:
    """A released private adapter: its folders in the runs layout, its privacy record and its test metrics."""

    task: str
    adapter_dir: Path
    encoder_adapter_dir: Path
    record: PrivacyRecord
    test_metrics: dict[str, float]


def script_flags(options: dict[str, Any]) -> list[str]:
    """``{"target_epsilon": 4, "lora_freeze_a": True}`` → ``["--target_epsilon", "4", "--lora_freeze_a", "true"]``."""
    argv = []
    for name, value in options.items():
        if isinstance(value, list | tuple):
            value = ",".join(map(str, value))
        argv += [f"--{name}", str(value).lower() if isinstance(value, bool) else str(value)]
    return argv


def train_adapter(dataset: datasets.Dataset | datasets.DatasetDict, task_name: str, *,
                  label_names: list[str] | None = None, text_column: str = "text", text_pair_column: str | None = None,
                  label_column: str = "label", runs_dir: str | os.PathLike = "runs",
                  **training_flags: Any) -> TrainedAdapter:
    """Train a private LoRA adapter on ``dataset`` (its ``train`` split, and ``validation``/``test`` if present,
    else carved from train) as run ``task_name`` under ``runs_dir``; ``label_names`` is the public label set (not
    needed for a ``ClassLabel`` column). ``training_flags`` are ``examples/train_glue.py`` flags without ``--``."""
    from hf_dpmerge.scripts.train import main

    splits = datasets.DatasetDict(train=dataset) if isinstance(dataset, datasets.Dataset) else dataset
    source = DatasetSource(text_column=text_column, text_pair_column=text_pair_column, label_column=label_column,
                           label_names=tuple(label_names) if label_names is not None else None,
                           label_names_from_private_data=bool(training_flags.get("label_names_from_private_data")))
    own_task(source, task_name, loaded=splits)  # every check before anything is written
    run_dir = Path(runs_dir) / task_name
    overwrite = bool(training_flags.get("overwrite"))
    check_release_target(run_dir / ADAPTER_DIR, overwrite)
    data_dir = run_dir / DATA_DIR
    if data_dir.exists() and not overwrite:
        raise FileExistsError(f"{data_dir} exists: pass overwrite=True to replace it, or another task_name")
    with staged_directory(data_dir) as staged:
        splits.save_to_disk(str(staged))
    argv = ["--dataset_name", str(data_dir), "--task_name", task_name, "--runs_dir", str(runs_dir),
            "--text_column", text_column, "--label_column", label_column,
            *(["--text_pair_column", text_pair_column] if text_pair_column else []),
            *(["--label_names", ",".join(label_names)] if label_names is not None else []),
            *script_flags(training_flags)]
    summary = main(argv)[task_name]
    return TrainedAdapter(task=task_name, adapter_dir=run_dir / ADAPTER_DIR,
                          encoder_adapter_dir=run_dir / ENCODER_ADAPTER_DIR,
                          record=PrivacyRecord.load(run_dir / ADAPTER_DIR), test_metrics=summary["test"])
