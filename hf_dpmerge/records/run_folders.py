"""The runs layout training writes and every command reads: one home for its folder names and their discovery.

    <runs>/base/                      the sequence-classification base every adapter trained from
    <runs>/<task>/adapter/            peft LoRA adapter + the task's head (modules_to_save) + dp_privacy.json
    <runs>/<task>/encoder_adapter/    the same LoRA without the head: what mergekit merges
    <runs>/<task>/eval_metrics.json   the adapter's test metrics
    <merged>/mergekit_config.yml      in every merge output (mergekit's copy of the config it merged)

A run is a folder ``<runs>/<name>/`` whose ``adapter/`` is a peft adapter (``adapter_config.json``); commands that
need its privacy record load it and say so when it is missing (an adapter is never skipped silently).
"""

from __future__ import annotations

import os
from pathlib import Path

from hf_dpmerge.utils.adapter_files import ADAPTER_CONFIG_NAME

BASE_DIR = "base"
ADAPTER_DIR = "adapter"
ENCODER_ADAPTER_DIR = "encoder_adapter"
EVAL_METRICS_NAME = "eval_metrics.json"
MERGE_CONFIG_NAME = "mergekit_config.yml"  # in every merge output: mergekit's copy of the merge config


def is_peft_adapter(path: str | os.PathLike) -> bool:
    return (Path(path) / ADAPTER_CONFIG_NAME).is_file()


def run_adapters(runs_dir: str | os.PathLike) -> dict[str, Path]:
    """``{name: <runs>/<name>/adapter}`` for every run under ``runs_dir``, sorted by name."""
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        raise FileNotFoundError(f"runs folder {runs_dir} does not exist; train adapters first, or pass --runs")
    return {d.name: d / ADAPTER_DIR for d in sorted(runs_dir.iterdir()) if is_peft_adapter(d / ADAPTER_DIR)}
