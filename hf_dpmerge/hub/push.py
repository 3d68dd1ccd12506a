"""Release a merged model to the Hugging Face Hub: merged weights, per-task heads and privacy records, card.

The repository holds only allow-listed files (``hf_dpmerge.records.release_files.RELEASE_ALLOW_LIST``), laid out as::

    README.md                      the model card (hf_dpmerge.hub.model_card)
    mergekit_config.yml, tokenizer the merged directory's files other than its model (README replaced)
    modeling_mean_pooling_bert.py  the remote code (transformers looks for it at the root with subfolder=)
    model.safetensors              mean pooling: the merged encoder, once, without a classifier
    <task>/config.json, head.safetensors, modeling_mean_pooling_bert.py, tokenizer files
                                   mean pooling: the task's head from the adapter's modules_to_save, and a
                                   config naming ../model.safetensors (``shared_encoder_weights``), which the
                                   remote code's ``from_pretrained`` reads (from a local folder or the Hub)
    <task>/config.json, model.safetensors, tokenizer files
                                   [CLS] pooling (a stock class, no remote code): merged encoder + the task's head
                                   (:mod:`hf_dpmerge.modeling.stock_release`)
    <task>/dp_privacy.json         the task's privacy record, byte for byte

``pipeline("text-classification", model=repo, model_kwargs={"subfolder": task}, trust_remote_code=True)``
gives each task its own head and labels. The root holds no config.json (the merged encoder has no meaningful
head), so stock loaders refuse it instead of predicting with the base's random head.

Everything is staged in a folder first; a real push then calls ``create_repo`` and ``upload_folder``
(``HF_ENDPOINT`` is honoured at call time), a dry run keeps the folder and touches no network.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from hf_dpmerge.hub.model_card import HeadInfo, MergeRecipe, build_model_card
from hf_dpmerge.modeling.task_head import TaskHeadError, task_head_state
from hf_dpmerge.records.record import PRIVACY_RECORD_NAME, PrivacyRecord, PrivacyRecordError
from hf_dpmerge.records.release_files import unlisted_files
from hf_dpmerge.records.selection_record import find_selection_record
from hf_dpmerge.records.statement import check_unseeded_release
from hf_dpmerge.utils.own_output import check_own_output

if TYPE_CHECKING:
    from hf_dpmerge.analysis.evaluation_report import EvaluationReport

DEFAULT_COMMIT_MESSAGE = "Upload differentially private merged model (hf_dpmerge)"
STAGING_MARKER = ".hf_dpmerge-staging"
# Files of the merged directory that the release replaces or must not carry (the root holds no model).
_SKIP_MERGED = {"README.md", "config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json"}
_MODEL_SUFFIXES = (".safetensors", ".bin")


class PushError(ValueError):
    """The release cannot be staged or uploaded as asked."""


@dataclass
class PushResult:
    repo_id: str
    private: bool
    dry_run: bool
    files: list[tuple[str, int]] = field(default_factory=list)  # (path in repo, size in bytes)
    staging_dir: Path | None = None  # kept for dry runs only
    repo_url: str | None = None
    commit_url: str | None = None


# ---------------------------------------------------------------------------------------------- inputs


def _check_merged_dir(merged_dir: Path) -> None:
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


def _skipped(rel: PurePosixPath) -> bool:
    """Merged-directory files the release does not take over: hidden ones, and at the root mergekit's card and
    the model (each task gets its own in ``<task>/``). Only root files are copied: task folders are rebuilt."""
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


def _load_record(task: str, adapter_dir: Path) -> PrivacyRecord:
    if not adapter_dir.exists():
        raise FileNotFoundError(f"adapter directory of task {task!r} does not exist: {adapter_dir}")
    record = PrivacyRecord.load(adapter_dir)
    if record.task is not None and record.task != task:
        raise PrivacyRecordError(
            f"{adapter_dir / PRIVACY_RECORD_NAME} is the record of task {record.task!r}, not of {task!r}"
        )
    return record


# ---------------------------------------------------------------------------------------------- staging


def _place(source: Path, target: Path) -> None:
    """Hard-link ``source`` at ``target`` (large weights are not copied), copying across file systems."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _prepare_staging_dir(staging_dir: Path, merged_dir: Path) -> None:
    staging = staging_dir.resolve()
    merged = merged_dir.resolve()
    if staging == merged or merged in staging.parents or staging in merged.parents:
        raise PushError(f"staging folder {staging_dir} must lie outside the merged model directory {merged_dir}")
    # a dry run's staging folder is always replaced, if it is one (it holds the marker)
    check_own_output(staging_dir, overwrite=True, marker=STAGING_MARKER, output="hf-dpmerge push staging",
                     flag="--staging_dir")
    if staging_dir.is_dir():
        shutil.rmtree(staging_dir)
    staging_dir.mkdir(parents=True, exist_ok=True)


def _stage(
    staging_dir: Path,
    merged_dir: Path,
    heads: Mapping[str, tuple[dict, HeadInfo]],
    adapters: Mapping[str, Path],
    card_text: str,
) -> None:
    from hf_dpmerge.modeling.stock_release import (
        REMOTE_CODE_FILE,
        SHARED_ENCODER_FILE,
        shares_encoder,
        write_shared_encoder,
        write_task_head_folder,
        write_task_model,
    )

    for source in sorted(merged_dir.iterdir()):
        if source.is_file() and not _skipped(PurePosixPath(source.name)):
            _place(source, staging_dir / source.name)
    shared = shares_encoder(merged_dir)
    if shared:  # the encoder once, at the root; each task folder holds its head and names the root's file
        write_shared_encoder(merged_dir, staging_dir / SHARED_ENCODER_FILE)
    for task, (_, info) in heads.items():
        task_dir = staging_dir / task
        labels = info.label_names
        if shared:
            write_task_head_folder(merged_dir, adapters[task], labels, task_dir, f"../{SHARED_ENCODER_FILE}")
        else:
            write_task_model(merged_dir, adapters[task], labels, task_dir)
        shutil.copyfile(adapters[task] / PRIVACY_RECORD_NAME, task_dir / PRIVACY_RECORD_NAME)
        if (task_dir / REMOTE_CODE_FILE).is_file():  # transformers reads remote code at the repo root
            shutil.copyfile(task_dir / REMOTE_CODE_FILE, staging_dir / REMOTE_CODE_FILE)
    (staging_dir / "README.md").write_text(card_text, encoding="utf-8")
    if unlisted := [rel for rel in unlisted_files(staging_dir) if rel != STAGING_MARKER]:
        raise PushError(f"the staged release holds files outside the release allow-list: {', '.join(unlisted)}")


def _listing(staging_dir: Path) -> list[tuple[str, int]]:
    return [
        (p.relative_to(staging_dir).as_posix(), p.stat().st_size)
        for p in sorted(staging_dir.rglob("*"))
        if p.is_file() and p.name != STAGING_MARKER
    ]


# ---------------------------------------------------------------------------------------------- release


def default_staging_dir(merged_dir: str | os.PathLike) -> Path:
    merged_dir = Path(merged_dir)
    return merged_dir.parent / f"{merged_dir.name}-hub"


def push_merged_model(
    merged_dir: str | os.PathLike,
    repo_id: str,
    *,
    adapters: Mapping[str, str | os.PathLike],
    evaluation: EvaluationReport | None = None,
    private: bool = True,
    dry_run: bool = False,
    token: str | None = None,
    commit_message: str = DEFAULT_COMMIT_MESSAGE,
    staging_dir: str | os.PathLike | None = None,
    merge_config: str | os.PathLike | None = None,
    base_model: str | None = None,
    license: str = "apache-2.0",
    endpoint: str | None = None,
    allow_seeded: bool = False,
) -> PushResult:
    """Stage ``merged_dir`` + each task's head and privacy record + the card, then upload (or not).

    ``adapters`` maps task → adapter directory (a peft adapter with its head in modules_to_save and its
    ``dp_privacy.json``). With ``dry_run`` the staged folder is written to ``staging_dir`` (default
    ``<merged_dir>-hub``) and kept; nothing touches the network. Otherwise the repository is created
    (private unless ``private=False``; an existing public repository is refused when ``private``) and
    the folder is uploaded in one ``upload_folder`` call to ``endpoint`` (default: ``HF_ENDPOINT``).

    Only allow-listed files are released (``RELEASE_ALLOW_LIST``): a merged directory holding anything else is
    refused with the list of those files. Adapters trained with a fixed ``dp_seed`` (or whose record predates
    the ``seeded`` field) are refused unless ``allow_seeded``; the card then warns that the seed undoes the noise.
    """
    from huggingface_hub.utils import validate_repo_id

    from hf_dpmerge.modeling.stock_release import shares_encoder  # transformers: only when staging

    validate_repo_id(repo_id)
    merged_dir = Path(merged_dir)
    _check_merged_dir(merged_dir)
    if not adapters:
        raise PushError("no adapters given: the release needs each task's head and privacy record")
    adapter_dirs = {str(task): Path(path) for task, path in adapters.items()}
    records = {task: _load_record(task, path) for task, path in adapter_dirs.items()}
    check_unseeded_release(records, allow_seeded, "--allow-seeded")
    heads = {task: extract_head(task, adapter_dirs[task], records[task]) for task in adapter_dirs}
    card = build_model_card(
        records,
        repo_id=repo_id,
        merge=MergeRecipe.load(merged_dir, merge_config),
        heads={task: info for task, (_, info) in heads.items()},
        evaluation=evaluation,
        base_model=base_model,
        license=license,
        # where relative base paths (runs/base) were written from: beside the merged dir or runs/
        local_roots=[merged_dir.resolve().parent, *(p.resolve().parent.parent.parent for p in adapter_dirs.values())],
        selection=find_selection_record(merged_dir),
        shared_encoder=shares_encoder(merged_dir),
    )
    card_text = str(card)
    return release_staged(
        lambda stage: _stage(stage, merged_dir, heads, adapter_dirs, card_text), merged_dir, repo_id,
        private=private, dry_run=dry_run, token=token, commit_message=commit_message, staging_dir=staging_dir,
        endpoint=endpoint,
    )


def release_staged(
    stage: Callable[[Path], None],
    merged_dir: Path,
    repo_id: str,
    *,
    private: bool,
    dry_run: bool,
    token: str | None,
    commit_message: str,
    staging_dir: str | os.PathLike | None,
    endpoint: str | None,
) -> PushResult:
    """Fill a folder with ``stage(folder)``; a dry run keeps it at ``staging_dir`` (default ``<merged_dir>-hub``),
    otherwise it goes up in one ``upload_folder`` call to a repository created private unless ``private`` is
    False (an existing public repository is refused when ``private``)."""
    if dry_run:
        target = Path(staging_dir) if staging_dir is not None else default_staging_dir(merged_dir)
        _prepare_staging_dir(target, merged_dir)
        stage(target)
        (target / STAGING_MARKER).write_text("written by hf-dpmerge push --dry-run; safe to delete\n")
        return PushResult(repo_id, private, True, files=_listing(target), staging_dir=target)

    from huggingface_hub import HfApi, constants

    if constants.is_offline_mode():
        raise PushError(
            "offline mode is on (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE): unset it to push, or use --dry-run"
        )
    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None
    api = HfApi(endpoint=endpoint.rstrip("/") if endpoint else None, token=token)
    with tempfile.TemporaryDirectory(prefix="hf_dpmerge-push-") as tmp:
        folder = Path(tmp) / "repo"
        folder.mkdir()
        stage(folder)
        files = _listing(folder)
        repo_url = api.create_repo(repo_id, private=private, repo_type="model", exist_ok=True)
        if private:
            info = api.repo_info(repo_id, repo_type="model")
            if info.private is False:
                raise PushError(
                    f"repository {repo_id} already exists and is public; refusing to upload to it as a "
                    "private release (pass --public / private=False to push to it)"
                )
        commit = api.upload_folder(
            repo_id=repo_id, folder_path=folder, repo_type="model", commit_message=commit_message
        )
    return PushResult(
        repo_id,
        private,
        False,
        files=files,
        repo_url=str(repo_url),
        commit_url=getattr(commit, "commit_url", None),
    )
