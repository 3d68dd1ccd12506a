"""``hf-dpmerge merge``'s per-task folders (written inside its staged output, before the rename): each merged
task as a model stock transformers loads.

mergekit writes one merged encoder whose own classifier head is the base's (meaningless for every task).
When the merged inputs are laid out as training writes them (``<runs>/<task>/encoder_adapter`` merged,
``<runs>/<task>/adapter`` holding the task's head and privacy record), ``<out>/<task>/`` receives the merged
encoder with that task's head and labels (:func:`hf_dpmerge.modeling.stock_release.write_task_model`) and the
task's ``dp_privacy.json``, so ``pipeline("text-classification", model=out, model_kwargs={"subfolder": task},
trust_remote_code=True)`` computes what ``hf-dpmerge evaluate`` scores. The remote code also goes to
``<out>/`` (transformers reads it at the root when given a subfolder). Causal-LM adapters get no folder: the
merged causal LM is the whole model.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from mergekit.config import MergeConfiguration

from hf_dpmerge.merging.inputs import input_settings
from hf_dpmerge.modeling.stock_release import REMOTE_CODE_FILE, head_label_names, write_task_model
from hf_dpmerge.records.record import CAUSAL_LM, PRIVACY_RECORD_NAME, PrivacyRecord
from hf_dpmerge.records.runs_layout import ADAPTER_DIR, is_peft_adapter


def task_adapters(config: MergeConfiguration) -> dict[str, Path]:
    """Task → adapter directory, for the inputs whose run folder holds ``adapter/`` with a privacy record."""
    found: dict[str, Path] = {}
    for reference, _, base in input_settings(config):
        if reference == base or not reference.lora:
            continue
        run = Path(reference.lora.path).parent
        adapter = run / ADAPTER_DIR
        if is_peft_adapter(adapter) and (adapter / PRIVACY_RECORD_NAME).is_file():
            found.setdefault(run.name, adapter)
    return found


def label_names(task: str, adapter: Path, record: PrivacyRecord) -> list[str]:
    """The record's label names (training saves them), else the task's, when they fit the adapter's head;
    else ``LABEL_i`` for the head's size."""
    from hf_dpmerge.data.tasks import get_task_spec

    try:
        spec_names = list(get_task_spec(record.task or task).label_names)
    except KeyError:
        spec_names = None
    return head_label_names(adapter, record.extra.get("label_names"), spec_names)


def write_task_folders(merged_dir: str | Path, config: MergeConfiguration) -> list[str]:
    """Write ``<merged_dir>/<task>/`` for every task of :func:`task_adapters`; the tasks written."""
    merged_dir = Path(merged_dir)
    written = []
    for task, adapter in task_adapters(config).items():
        record = PrivacyRecord.load(adapter)
        if record.extra.get("model_kind") == CAUSAL_LM:  # a merged causal LM is whole: no per-task head
            continue
        write_task_model(merged_dir, adapter, label_names(task, adapter, record), merged_dir / task)
        shutil.copyfile(adapter / PRIVACY_RECORD_NAME, merged_dir / task / PRIVACY_RECORD_NAME)
        if (merged_dir / task / REMOTE_CODE_FILE).is_file():
            shutil.copyfile(merged_dir / task / REMOTE_CODE_FILE, merged_dir / REMOTE_CODE_FILE)
        written.append(task)
    return written
