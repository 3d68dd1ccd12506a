"""Release a merged model to the Hugging Face Hub: the staged folder (:mod:`hf_dpmerge.hub.staging`) goes up in
one ``upload_folder`` call to a repository ``create_repo`` makes private unless asked otherwise (``HF_ENDPOINT`` is
honoured at call time); a dry run keeps the folder and touches no network.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hf_dpmerge.analysis.emr_modulation import is_emr_merge
from hf_dpmerge.hub.model_card import MergeRecipe, build_model_card
from hf_dpmerge.hub.staging import (
    STAGING_MARKER,
    PushError,
    check_merged_dir,
    check_release_base,
    default_staging_dir,
    extract_head,
    load_task_record,
    prepare_staging_dir,
    stage_merged_release,
    staged_files,
)
from hf_dpmerge.records.fingerprint import adapter_fingerprint
from hf_dpmerge.records.merge_base import merge_base_dir
from hf_dpmerge.records.selection_record import find_selection_record
from hf_dpmerge.records.statement import check_unseeded_release

if TYPE_CHECKING:
    from hf_dpmerge.analysis.evaluation_report import EvaluationReport

DEFAULT_COMMIT_MESSAGE = "Upload differentially private merged model (hf_dpmerge)"


@dataclass
class PushResult:
    repo_id: str
    private: bool
    dry_run: bool
    files: list[tuple[str, int]] = field(default_factory=list)  # (path in repo, size in bytes)
    staging_dir: Path | None = None  # kept for dry runs only
    repo_url: str | None = None
    commit_url: str | None = None


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
    runs_base: str | os.PathLike | None = None,
) -> PushResult:
    """Stage ``merged_dir`` + each task's head and privacy record + the card, then upload (or not).

    ``adapters`` maps task → adapter directory (a peft adapter with its head in modules_to_save and its
    ``dp_privacy.json``). With ``dry_run`` the staged folder is written to ``staging_dir`` (default
    ``<merged_dir>-hub``) and kept; nothing touches the network. Otherwise the repository is created
    (private unless ``private=False``; an existing public repository is refused when ``private``) and
    the folder is uploaded in one ``upload_folder`` call to ``endpoint`` (default: ``HF_ENDPOINT``).

    Only allow-listed files are released (``RELEASE_ALLOW_LIST``): a merged directory holding anything else is
    refused with the list of those files. Adapters trained with a fixed ``dp_seed`` (or whose record predates
    the ``seeded`` field), and a merge chosen by a seeded ``hf-dpmerge tune``/``evolve`` (its ``dp_selection.json``
    says ``seeded`` true, or predates the field), are refused unless ``allow_seeded``; the card then warns that the
    seed undoes the noise. A merge chosen by ``hf-dpmerge tune``/``evolve`` is released only with the adapters its
    selection was made with (their fingerprints), under the composed total. An adapter whose record's base
    fingerprint is not that of the merge's base (the one its ``mergekit_config.yml`` names, else ``runs_base``: the
    runs' ``base/``) is refused (:func:`~hf_dpmerge.hub.staging.check_release_base`).
    """
    from huggingface_hub.utils import validate_repo_id

    from hf_dpmerge.modeling.stock_release import shares_encoder  # transformers: only when staging

    validate_repo_id(repo_id)
    merged_dir = Path(merged_dir)
    check_merged_dir(merged_dir)
    if not adapters:
        raise PushError("no adapters given: the release needs each task's head and privacy record")
    adapter_dirs = {str(task): Path(path) for task, path in adapters.items()}
    records = {task: load_task_record(task, path) for task, path in adapter_dirs.items()}
    selection = find_selection_record(merged_dir)
    check_unseeded_release(records, allow_seeded, "--allow-seeded", selection)
    # where relative base paths (runs/base) were written from: beside the merged dir or runs/
    local_roots = [merged_dir.resolve().parent, *(p.resolve().parent.parent.parent for p in adapter_dirs.values())]
    base_checked = check_release_base(merged_dir, records, runs_base, local_roots)
    heads = {task: extract_head(task, adapter_dirs[task], records[task]) for task in adapter_dirs}
    shared = shares_encoder(merged_dir)
    emr_base = None
    if is_emr_merge(merged_dir) and (emr_base := merge_base_dir(merged_dir, runs_base, local_roots)) is None:
        raise PushError(f"{merged_dir} is an emr merge: its task modulators are computed from its base, which is "
                        "not found (pass --runs with the runs it merged, holding base/)")
    card = build_model_card(
        records,
        repo_id=repo_id,
        merge=MergeRecipe.load(merged_dir, merge_config),
        heads={task: info for task, (_, info) in heads.items()},
        evaluation=evaluation,
        base_model=base_model,
        license=license,
        local_roots=local_roots,
        selection=selection,
        fingerprints={task: adapter_fingerprint(path) for task, path in adapter_dirs.items()} if selection else None,
        shared_encoder=shared,
        base_checked=base_checked,
    )
    card_text = str(card)
    return release_staged(
        lambda stage: stage_merged_release(stage, merged_dir, heads, adapter_dirs, card_text, shared, emr_base),
        merged_dir,
        repo_id,
        private=private, dry_run=dry_run, token=token, commit_message=commit_message, staging_dir=staging_dir,
        endpoint=endpoint,
    )


def release_staged(
    stage: Callable[[Path], None],
    source: Path,
    repo_id: str,
    *,
    private: bool,
    dry_run: bool,
    token: str | None,
    commit_message: str,
    staging_dir: str | os.PathLike | None,
    endpoint: str | None,
) -> PushResult:
    """Fill a folder with ``stage(folder)``; a dry run keeps it at ``staging_dir`` (default ``<source>-hub``, outside
    ``source``: what the release is made from), otherwise it goes up in one ``upload_folder`` call to a repository
    created private unless ``private`` is False (an existing public repository is refused when ``private``)."""
    if dry_run:
        target = Path(staging_dir) if staging_dir is not None else default_staging_dir(source)
        prepare_staging_dir(target, source)
        stage(target)
        (target / STAGING_MARKER).write_text("written by hf-dpmerge push --dry-run; safe to delete\n")
        return PushResult(repo_id, private, True, files=staged_files(target), staging_dir=target)

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
        files = staged_files(folder)
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
