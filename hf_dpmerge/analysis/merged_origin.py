"""Whether a merged model was merged from the runs' base, checked before a merged model is scored as theirs.

A merge of LoRA task vectors changes only the base weights under the adapters' LoRA layers (each record's
``base_model_hash_tensors``) and the task heads; every other tensor of the merged model is the base's. So the
merged model must have the base's architecture (``config.json``'s ``model_type``) and, where the records name
the tensors they cover, the base's fingerprint (:func:`~hf_dpmerge.records.fingerprint.base_fingerprint`) on
every other tensor the two share, compared in the merged model's dtype.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from hf_dpmerge.analysis.runs_layout import TaskRun
from hf_dpmerge.records.fingerprint import base_fingerprint, directory_base_tensors, saved_tensor_names
from hf_dpmerge.utils.adapter_files import ADAPTER_CONFIG_NAME


def architecture(model_dir: Path) -> str:
    """``model_type`` (``architectures``) of a saved model's ``config.json``."""
    config = json.loads((model_dir / "config.json").read_text())
    return f"{config.get('model_type')} ({', '.join(config.get('architectures') or ['?'])})"


def _untouched(runs: Sequence[TaskRun], names: set[str]) -> list[str] | None:
    """The tensors no run's adapter changes (None when a record does not name the ones it covers)."""
    touched: set[str] = set()
    heads: set[str] = set()
    for run in runs:
        if not run.record.base_model_hash_tensors:
            return None
        touched |= set(run.record.base_model_hash_tensors)
        config = json.loads((run.adapter_dir / ADAPTER_CONFIG_NAME).read_text())
        heads |= set(config.get("modules_to_save") or [])
    return sorted(n for n in names - touched if not heads & set(n.split(".")))


def check_merged_from_base(base_dir: Path, merged_dir: Path, runs: Sequence[TaskRun]) -> None:
    """Refuse ``merged_dir`` unless it was merged from ``base_dir`` (module docstring), naming both."""
    base, merged = architecture(base_dir), architecture(merged_dir)
    if base.split(" ")[0] != merged.split(" ")[0]:
        raise ValueError(f"merged model {merged_dir} is a {merged} but the runs' base {base_dir} is a {base}: it was "
                         "not merged from these runs' base; pass --merged with the merge of these runs")
    names = _untouched(runs, set(saved_tensor_names(base_dir)) & set(saved_tensor_names(merged_dir)))
    for name in names or []:
        [merged_tensor] = directory_base_tensors(merged_dir, [name]).values()
        [base_tensor] = directory_base_tensors(base_dir, [name]).values()
        if base_tensor.shape != merged_tensor.shape or not base_tensor.to(merged_tensor.dtype).equal(merged_tensor):
            raise ValueError(
                f"merged model {merged_dir} was not merged from the runs' base {base_dir}: {name}, which no adapter "
                f"changes, has base fingerprint {base_fingerprint({name: merged_tensor})} there but "
                f"{base_fingerprint({name: base_tensor})} in the base; pass --merged with the merge of these runs"
            )
