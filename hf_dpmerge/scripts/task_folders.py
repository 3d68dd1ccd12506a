"""``hf-dpmerge merge``'s per-task folders (written inside its staged output, before the rename): each merged
task as a model stock transformers loads.

mergekit writes one merged encoder whose own classifier head is the base's (meaningless for every task).
When the merged inputs are laid out as training writes them (``<runs>/<task>/encoder_adapter`` merged,
``<runs>/<task>/adapter`` holding the task's head and privacy record), ``<out>/<task>/`` receives the merged
encoder with that task's head and labels (:func:`hf_dpmerge.modeling.stock_release.write_task_model`) and the
task's ``dp_privacy.json``, so ``pipeline("text-classification", model=out, model_kwargs={"subfolder": task},
trust_remote_code=True)`` computes what ``hf-dpmerge evaluate`` scores. The remote code also goes to
``<out>/`` (transformers reads it at the root when given a subfolder); an ``emr`` root's task folders hold each
task's modulated model (:mod:`hf_dpmerge.analysis.emr_modulation`). Causal-LM adapters get no folder.

Once the task folders are written, the root's head is removed (:func:`drop_root_head`): the root is the merged
encoder, and a stock ``AutoModelForSequenceClassification`` loading it reports a newly initialised head instead
of predicting silently with a meaningless one. Plain ``mergekit-yaml`` output is mergekit's and keeps its head.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mergekit.config import MergeConfiguration

from hf_dpmerge.analysis.emr_modulation import EMR_METHOD, modulate_saved_task_model, unified_delta
from hf_dpmerge.merging.inputs import input_directory, task_adapters
from hf_dpmerge.modeling.stock_release import REMOTE_CODE_FILE, release_label_names, write_task_model
from hf_dpmerge.records.record import CAUSAL_LM, PRIVACY_RECORD_NAME, PrivacyRecord


def label_names(task: str, adapter: Path, record: PrivacyRecord) -> list[str]:
    """The record's label names (training saves them), else the task's, when they fit the adapter's head;
    else ``LABEL_i`` for the head's size."""
    from hf_dpmerge.data.tasks import get_task_spec

    try:
        spec_names = list(get_task_spec(record.task or task).label_names)
    except KeyError:
        spec_names = None
    return release_label_names(adapter, record.extra, spec_names)


def write_task_folders(merged_dir: str | Path, config: MergeConfiguration) -> list[str]:
    """Write ``<merged_dir>/<task>/`` for every task of :func:`task_adapters`; the tasks written."""
    merged_dir = Path(merged_dir)
    written = []
    unified = None
    if config.merge_method == EMR_METHOD and config.base_model is not None:
        unified = unified_delta(input_directory(config.base_model), merged_dir)
    for task, adapter in task_adapters(config).items():
        record = PrivacyRecord.load(adapter)
        if record.extra.get("model_kind") == CAUSAL_LM:  # a merged causal LM is whole: no per-task head
            continue
        write_task_model(merged_dir, adapter, label_names(task, adapter, record), merged_dir / task)
        if unified is not None:
            modulate_saved_task_model(merged_dir / task, adapter, unified)
        shutil.copyfile(adapter / PRIVACY_RECORD_NAME, merged_dir / task / PRIVACY_RECORD_NAME)
        if (merged_dir / task / REMOTE_CODE_FILE).is_file():
            shutil.copyfile(merged_dir / task / REMOTE_CODE_FILE, merged_dir / REMOTE_CODE_FILE)
        written.append(task)
    if written:
        drop_root_head(merged_dir, written)
    return written


HEAD_PREFIX = "classifier."  # the task head of every classifier training writes (peft modules_to_save)
ROOT_NOTE = "hf_dpmerge_merged_encoder"  # config.json key saying where the task models are


def drop_root_head(merged_dir: str | Path, tasks: list[str]) -> None:
    """Remove the head tensors (``classifier.*``) from the root's safetensors files (and their index) and say in
    ``config.json`` that each task's classifier is in ``<merged>/<task>/``."""
    from safetensors.torch import load_file, save_file

    merged_dir = Path(merged_dir)
    dropped: set[str] = set()
    for path in sorted(merged_dir.glob("*.safetensors")):
        tensors = load_file(path)
        head = {name for name in tensors if name.startswith(HEAD_PREFIX)}
        if head:
            save_file({k: v for k, v in tensors.items() if k not in head}, path, metadata={"format": "pt"})
            dropped |= head
    index = merged_dir / "model.safetensors.index.json"
    if dropped and index.is_file():
        data = json.loads(index.read_text())
        data["weight_map"] = {k: v for k, v in data.get("weight_map", {}).items() if k not in dropped}
        index.write_text(json.dumps(data, indent=2) + "\n")
    config_path = merged_dir / "config.json"
    config = json.loads(config_path.read_text())
    config[ROOT_NOTE] = {"tasks": tasks, "note": "the merged encoder, without a task head: load a task's classifier "
                         "from its subfolder (subfolder='<task>')"}
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
