"""The staged folder of a Hub release: the merged model's checks, each task's head and record, the layout.

A release is always staged first (:mod:`hf_dpmerge.hub.push` uploads it or, for a dry run, keeps it), holding only
allow-listed files (``hf_dpmerge.records.release_files.RELEASE_ALLOW_LIST``): the card ``README.md``, the merged
directory's files other than its model, and per task ``<task>/dp_privacy.json`` byte for byte. Mean pooling: the
merged encoder once at the root (``model.safetensors``, no classifier) and per ``<task>/`` its head
(``head.safetensors``), remote code and a config naming ``../model.safetensors`` (``shared_encoder_weights``);
[CLS] pooling: full stock task models (:mod:`hf_dpmerge.modeling.stock_release`). An ``emr`` merge adds δ_uni
at the root (``unified_delta.safetensors``) and per task its masks and rescaler (``task_modulator.safetensors``),
or, [CLS] pooling, modulates each task model's weights.
The root holds no config.json, so stock loaders refuse it instead of predicting with the base's random head; a
task loads with
``pipeline("text-classification", model=repo, model_kwargs={"subfolder": task}, trust_remote_code=True)``.
See docs/design.md §10.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from hf_dpmerge.analysis.emr_modulation import modulate_saved_task_model, run_modulator, unified_delta
from hf_dpmerge.hub.model_card import HeadInfo
from hf_dpmerge.modeling.task_head import TaskHeadError, task_head_state
from hf_dpmerge.records.merge_base import check_trained_on, merge_base_dir
from hf_dpmerge.records.record import PRIVACY_RECORD_NAME, PrivacyRecord, PrivacyRecordError
from hf_dpmerge.records.release_files import unlisted_files
from hf_dpmerge.utils.own_output import check_own_output

STAGING_MARKER = ".hf_dpmerge-staging"
# Files of the merged directory that the release replaces or must not carry (the root holds no config.json; its
# weights, if any, are the encoder the release writes itself).
_SKIP_MERGED = {"README.md", "config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json"}
_MODEL_SUFFIXES = (".safetensors", ".bin")


class PushError(ValueError):
    """The release cannot be staged or uploaded as asked."""


def check_merged_dir(merged_dir: Path) -> None:
    """Refuse a merged directory that is missing, holds no model, or holds a file the allow-list does not allow."""
    if not merged_dir.exists():
        raise FileNotFoundError(f"merged model directory {merged_dir} does not exist (run mergekit-yaml first)")
    if not merged_dir.is_dir():
        raise PushError(f"merged model path {merged_dir} is not a directory")
    if not (merged_dir / "config.json").is_file():
        raise PushError(f"{merged_dir} is not a model directory: it has no config.json")
    weights = [p for p in merged_dir.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file()]
    if not weights:
        raise PushError(f"{merged_dir} has no model weights (*.safetensors or *.bin)")
    # every file is checked, hidden ones and root *.bin/*.safetensors that are not model weights included
    # (training_args.bin holds dp_seed): none is skipped silently, even those the release would not copy
    unlisted = unlisted_files(merged_dir)
    if unlisted:
        raise PushError(
            f"{merged_dir} holds files a release may not carry: {', '.join(unlisted)}. A release holds only "
            "weights, model/merge configuration, tokenizer files, privacy records and the card "
            "(hf_dpmerge.records.release_files.RELEASE_ALLOW_LIST); remove these files from the merged directory "
            "(or move them elsewhere) and push again"
        )


def check_release_base(merged_dir: Path, records: Mapping[str, PrivacyRecord], runs_base: str | os.PathLike | None,
                       roots: Sequence[Path]) -> bool:
    """Refuse a task whose adapter was trained on another base than the merge's (``mergekit_config.yml``'s
    ``base_model``, relative ones looked up under ``roots`` too, else ``runs_base``:
    :func:`~hf_dpmerge.records.merge_base.merge_base_dir`); True when every record was checked against it (the card
    may then say so)."""
    base_dir = merge_base_dir(merged_dir, runs_base, roots)
    return base_dir is not None and check_trained_on(
        records, base_dir, "push a merge of adapters trained on that base (hf-dpmerge merge refuses the others), or "
                           "pass --runs with the runs this merge was made from")


def _skipped(rel: PurePosixPath) -> bool:
    """Merged-directory files the release does not take over: hidden ones, and at the root mergekit's card, the
    config and the model (the release writes the shared encoder or per-task models itself). Only root files are
    copied: task folders are rebuilt."""
    top = len(rel.parts) == 1
    return any(part.startswith(".") for part in rel.parts) or top and (
        rel.name in _SKIP_MERGED or rel.suffix in _MODEL_SUFFIXES)


def extract_head(task: str, adapter_dir: str | os.PathLike, record: PrivacyRecord) -> tuple[dict, HeadInfo]:
    """The classifier head tensors saved in an adapter's ``modules_to_save``, named as in the base model.

    peft saves ``base_model.model.<module>.<param>``; the ``base_model.model.`` prefix is dropped so the
    tensors load into the task model with ``load_state_dict(head, strict=False)``.
    """
    adapter_dir = Path(adapter_dir)
    try:
        head = task_head_state(adapter_dir)
    except TaskHeadError as err:
        raise PushError(f"task {task!r}: {err}") from None
    from hf_dpmerge.modeling.stock_release import release_label_names  # transformers: only when staging

    labels = release_label_names(adapter_dir, record.extra, head=head)  # the rule of the merge's task folders
    return head, HeadInfo(task=task, num_labels=len(labels), label_names=labels, keys=sorted(head))


def load_task_record(task: str, adapter_dir: Path) -> PrivacyRecord:
    """The adapter's privacy record, refused if it is another task's."""
    if not adapter_dir.exists():
        raise FileNotFoundError(f"adapter directory of task {task!r} does not exist: {adapter_dir}")
    record = PrivacyRecord.load(adapter_dir)
    if record.task is not None and record.task != task:
        raise PrivacyRecordError(
            f"{adapter_dir / PRIVACY_RECORD_NAME} is the record of task {record.task!r}, not of {task!r}"
        )
    return record


def place_file(source: Path, target: Path) -> None:
    """Hard-link ``source`` at ``target`` (large weights are not copied), copying across file systems."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def prepare_staging_dir(staging_dir: Path, source: Path) -> None:
    """An empty ``staging_dir`` outside ``source`` (the merged model directory, or the runs folder of a
    multi-adapter release); a previous staging (it holds the marker) is replaced."""
    staging = staging_dir.resolve()
    origin = source.resolve()
    if staging == origin or origin in staging.parents or staging in origin.parents:
        raise PushError(f"staging folder {staging_dir} must lie outside {source}, which the release is made from")
    # a dry run's staging folder is always replaced, if it is one (it holds the marker)
    check_own_output(staging_dir, overwrite=True, marker=STAGING_MARKER, output="hf-dpmerge push staging",
                     flag="--staging_dir")
    if staging_dir.is_dir():
        shutil.rmtree(staging_dir)
    staging_dir.mkdir(parents=True, exist_ok=True)


def stage_merged_release(
    staging_dir: Path,
    merged_dir: Path,
    heads: Mapping[str, tuple[dict, HeadInfo]],
    adapters: Mapping[str, Path],
    card_text: str,
    shared_encoder: bool,
    emr_base: Path | None = None,
) -> None:
    """Fill ``staging_dir`` with the release laid out as above; refuse it if it holds an unlisted file.
    ``shared_encoder`` (:func:`hf_dpmerge.modeling.stock_release.shares_encoder`): the encoder once at the root.
    ``emr_base``: the base of an ``emr`` merge, whose unified delta goes to the root and each task's modulator
    beside its head, or modulates each whole task model (:mod:`hf_dpmerge.analysis.emr_modulation`)."""
    from hf_dpmerge.modeling.stock_release import (  # transformers: only when staging
        REMOTE_CODE_FILE,
        SHARED_ENCODER_FILE,
        UNIFIED_DELTA_FILE,
        write_shared_encoder,
        write_task_head_folder,
        write_task_model,
        write_unified_delta,
    )

    unified = None if emr_base is None else unified_delta(emr_base, merged_dir)
    if unified is not None and shared_encoder:
        write_unified_delta(unified, staging_dir / UNIFIED_DELTA_FILE)

    for source in sorted(merged_dir.iterdir()):
        if source.is_file() and not _skipped(PurePosixPath(source.name)):
            place_file(source, staging_dir / source.name)
    if shared_encoder:  # the encoder once, at the root; each task folder holds its head and names the root's file
        write_shared_encoder(merged_dir, staging_dir / SHARED_ENCODER_FILE)
    for task, (head, info) in heads.items():
        task_dir = staging_dir / task
        labels = info.label_names
        if shared_encoder:
            modulator = None if unified is None else run_modulator(adapters[task], unified)
            write_task_head_folder(merged_dir, head, labels, task_dir, f"../{SHARED_ENCODER_FILE}", modulator,
                                   f"../{UNIFIED_DELTA_FILE}")
        else:
            write_task_model(merged_dir, adapters[task], labels, task_dir)
            if unified is not None:  # a whole task model: its weights modulated
                modulate_saved_task_model(task_dir, adapters[task], unified)
        shutil.copyfile(adapters[task] / PRIVACY_RECORD_NAME, task_dir / PRIVACY_RECORD_NAME)
        if (task_dir / REMOTE_CODE_FILE).is_file():  # transformers reads remote code at the repo root
            shutil.copyfile(task_dir / REMOTE_CODE_FILE, staging_dir / REMOTE_CODE_FILE)
    (staging_dir / "README.md").write_text(card_text, encoding="utf-8")
    check_staged_files(staging_dir)


def check_staged_files(staging_dir: Path) -> None:
    """Refuse a staged release holding a file the release allow-list does not name (the marker aside)."""
    if unlisted := [rel for rel in unlisted_files(staging_dir) if rel != STAGING_MARKER]:
        raise PushError(f"the staged release holds files outside the release allow-list: {', '.join(unlisted)}")


def staged_files(staging_dir: Path) -> list[tuple[str, int]]:
    """(path in the repository, size in bytes) of every staged file, the marker left out."""
    return [
        (p.relative_to(staging_dir).as_posix(), p.stat().st_size)
        for p in sorted(staging_dir.rglob("*"))
        if p.is_file() and p.name != STAGING_MARKER
    ]


def default_staging_dir(merged_dir: str | os.PathLike) -> Path:
    """``<merged_dir>-hub``, beside the merged directory."""
    merged_dir = Path(merged_dir)
    return merged_dir.parent / f"{merged_dir.name}-hub"
