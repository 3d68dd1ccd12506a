"""Whether a merged model is a merge of the runs, from their base, checked before it is scored as theirs.

Before the runs are read (:func:`check_is_merge`): the merged model is not the runs' base itself, has the base's
architecture (``config.json``'s ``model_type``) and is a merge output (it holds ``mergekit_config.yml``, as every
``hf-dpmerge merge`` and ``mergekit-yaml`` output does). Then (:func:`check_merges_runs`): that config merges every
run scored, each run's privacy record fingerprints the merge's base (the config's ``base_model``, else the runs'
base: :mod:`hf_dpmerge.records.merge_base`), and the merged model was merged from the runs' base
(:func:`check_merged_from_base`).

A merge of LoRA task vectors changes only the base weights under the adapters' LoRA layers (each record's
``base_model_hash_tensors``) and the task heads; every other tensor of the merged model is the base's. So the
merged model must have, where the records name the tensors they cover, the base's fingerprint
(:func:`~hf_dpmerge.records.fingerprint.base_fingerprint`) on every other tensor the two share, compared in the
merged model's dtype.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from hf_dpmerge.analysis.task_run import TaskRun, merged_tasks
from hf_dpmerge.records.fingerprint import base_fingerprint, directory_base_tensors, saved_tensor_names
from hf_dpmerge.records.merge_base import check_trained_on, merge_base_dir
from hf_dpmerge.records.run_folders import MERGE_CONFIG_NAME
from hf_dpmerge.utils.adapter_files import ADAPTER_CONFIG_NAME

_FIX = "pass --merged with the merge of these runs"


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


def _check_architecture(base_dir: Path, merged_dir: Path) -> None:
    base, merged = architecture(base_dir), architecture(merged_dir)
    if base.split(" ")[0] != merged.split(" ")[0]:
        raise ValueError(f"merged model {merged_dir} is a {merged} but the runs' base {base_dir} is a {base}: it was "
                         f"not merged from these runs' base; {_FIX}")


def check_is_merge(base_dir: Path, merged_dir: Path) -> None:
    """Refuse ``merged_dir`` when it is the runs' base ``base_dir`` itself, has another architecture, or is no merge
    output (no ``mergekit_config.yml``), naming it."""
    if merged_dir.resolve() == base_dir.resolve():
        raise ValueError(f"--merged {merged_dir} is the runs' base {base_dir} itself, not a merge of the runs; {_FIX}")
    _check_architecture(base_dir, merged_dir)
    if not (merged_dir / MERGE_CONFIG_NAME).is_file():
        raise ValueError(f"merged model {merged_dir} is no merge output: it has no {MERGE_CONFIG_NAME} (every "
                         f"hf-dpmerge merge and mergekit-yaml output holds one); {_FIX}")


def check_merges_runs(runs_dir: Path, base_dir: Path, merged_dir: Path, runs: Sequence[TaskRun]) -> None:
    """Refuse ``merged_dir`` (a merge output: :func:`check_is_merge`) unless its ``mergekit_config.yml`` merges every
    one of ``runs`` (the folders under ``runs_dir``), each was trained on the merge's base, and it was merged from
    ``base_dir``."""
    merged = merged_tasks(runs_dir, merged_dir) or []  # refuses a config that merges none of the runs
    if missing := [run.name for run in runs if run.name not in merged]:
        raise ValueError(f"merged model {merged_dir} does not merge {', '.join(missing)} (its {MERGE_CONFIG_NAME} "
                         f"merges {', '.join(merged)}): pass --tasks among those, or --merged with a merge of them")
    roots = [merged_dir.resolve().parent, runs_dir.resolve().parent]
    merge_base = merge_base_dir(merged_dir, base_dir, roots) or base_dir
    check_trained_on({run.name: run.record for run in runs}, merge_base, _FIX)
    check_merged_from_base(base_dir, merged_dir, runs)


def check_merged_from_base(base_dir: Path, merged_dir: Path, runs: Sequence[TaskRun]) -> None:
    """Refuse ``merged_dir`` unless it was merged from ``base_dir`` (module docstring), naming both."""
    _check_architecture(base_dir, merged_dir)
    names = _untouched(runs, set(saved_tensor_names(base_dir)) & set(saved_tensor_names(merged_dir)))
    for name in names or []:
        [merged_tensor] = directory_base_tensors(merged_dir, [name]).values()
        [base_tensor] = directory_base_tensors(base_dir, [name]).values()
        if base_tensor.shape != merged_tensor.shape or not base_tensor.to(merged_tensor.dtype).equal(merged_tensor):
            raise ValueError(
                f"merged model {merged_dir} was not merged from the runs' base {base_dir}: {name}, which no adapter "
                f"changes, has base fingerprint {base_fingerprint({name: merged_tensor})} there but "
                f"{base_fingerprint({name: base_tensor})} in the base; {_FIX}"
            )
