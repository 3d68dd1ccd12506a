"""The lossless release beside the merge: one repository holding the runs' shared base once (its root) and every
task's adapter, its LoRA and its own head (``modules_to_save``), under ``<task>/``, for stock peft:
``PeftModel.from_pretrained(base, repo, subfolder=task, adapter_name=task)``, ``load_adapter`` for the others, and
mixed-task batches (``adapter_names=``) across tasks whose heads have as many labels (peft stacks the heads'
outputs). Each task computes its own adapter: ``hf-dpmerge evaluate``'s individual column. Staged as the merged
release is (:func:`hf_dpmerge.hub.push.release_staged`): allow-listed files only, the adapter's weights and record
byte for byte, its ``adapter_config.json`` naming the repository as its base (no path of the training machine).
Adapters trained on another base than ``<runs>/base`` are refused. See docs/workflow.md.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from hf_dpmerge.hub.causal_release import is_causal_release
from hf_dpmerge.hub.model_card import build_multi_adapter_card
from hf_dpmerge.hub.push import PushResult, release_staged
from hf_dpmerge.hub.staging import PushError, check_staged_files, extract_head, load_task_record, place_file
from hf_dpmerge.records.merge_base import check_trained_on
from hf_dpmerge.records.record import PRIVACY_RECORD_NAME
from hf_dpmerge.records.run_folders import BASE_DIR
from hf_dpmerge.records.statement import check_unseeded_release
from hf_dpmerge.utils.adapter_files import ADAPTER_CONFIG_NAME, ADAPTER_SAFETENSORS_NAME, set_adapter_base

if TYPE_CHECKING:
    from hf_dpmerge.analysis.evaluation_report import EvaluationReport

MULTI_ADAPTER_DIR = "multi-adapter-hub"
MULTI_ADAPTER_COMMIT_MESSAGE = "Upload differentially private task adapters (hf_dpmerge)"


def default_multi_adapter_dir(runs_dir: str | os.PathLike) -> Path:
    """``multi-adapter-hub`` beside the runs folder (as ``merged-hub`` lies beside ``merged``)."""
    runs_dir = Path(runs_dir)
    return (runs_dir.parent if runs_dir.name else runs_dir.resolve().parent) / MULTI_ADAPTER_DIR


def stage_multi_adapter(folder: Path, base_dir: Path, adapters: Mapping[str, Path], repo_id: str,
                        card_text: str) -> None:
    """Fill ``folder``: the stock base at the root, per task its adapter (config naming ``repo_id`` as its base,
    weights and record as released) and the card; refused if it holds a file the allow-list does not name."""
    from hf_dpmerge.modeling.stock_release import write_stock_base  # transformers: only when staging

    write_stock_base(base_dir, folder)
    for task, adapter in adapters.items():
        task_dir = folder / task
        task_dir.mkdir()
        shutil.copyfile(adapter / ADAPTER_CONFIG_NAME, task_dir / ADAPTER_CONFIG_NAME)  # a copy: it is rewritten
        set_adapter_base(task_dir, repo_id)
        place_file(adapter / ADAPTER_SAFETENSORS_NAME, task_dir / ADAPTER_SAFETENSORS_NAME)
        shutil.copyfile(adapter / PRIVACY_RECORD_NAME, task_dir / PRIVACY_RECORD_NAME)
    (folder / "README.md").write_text(card_text, encoding="utf-8")
    check_staged_files(folder)


def push_multi_adapter(
    runs_dir: str | os.PathLike,
    repo_id: str,
    *,
    adapters: Mapping[str, str | os.PathLike],
    evaluation: EvaluationReport | None = None,
    base_model: str | None = None,
    license: str = "apache-2.0",
    allow_seeded: bool = False,
    staging_dir: str | os.PathLike | None = None,
    dry_run: bool = False,
    private: bool = True,
    commit_message: str = MULTI_ADAPTER_COMMIT_MESSAGE,
    token: str | None = None,
    endpoint: str | None = None,
) -> PushResult:
    """Stage ``<runs_dir>/base`` and the ``adapters`` (task → a run's ``adapter/`` folder) with the card, then upload
    it (or, with ``dry_run``, keep it at ``staging_dir``, default :func:`default_multi_adapter_dir`), as
    :func:`~hf_dpmerge.hub.push.push_merged_model` does. Refused: causal-LM runs, seeded adapters unless
    ``allow_seeded``, an adapter whose record's base fingerprint is not the base's, one without
    ``adapter_model.safetensors`` or without a classifier head."""
    from huggingface_hub.utils import validate_repo_id

    from hf_dpmerge.modeling.stock_release import shares_encoder  # transformers: only when staging

    validate_repo_id(repo_id)
    runs_dir = Path(runs_dir)
    base_dir = runs_dir / BASE_DIR
    if not (base_dir / "config.json").is_file():
        raise FileNotFoundError(f"{base_dir} holds no base model (no config.json): the multi-adapter release holds "
                                "the base the adapters trained on, <runs>/base; pass --runs with their runs folder")
    if not adapters:
        raise PushError("no adapters given: the multi-adapter release needs each task's adapter and record")
    adapter_dirs = {str(task): Path(path) for task, path in adapters.items()}
    records = {task: load_task_record(task, path) for task, path in adapter_dirs.items()}
    if is_causal_release(records):
        raise PushError("--multi_adapter releases sequence-classification runs (per-task heads on one encoder); "
                        "release causal-LM runs by pushing their merge")
    check_unseeded_release(records, allow_seeded, "--allow-seeded")
    base_checked = check_trained_on(records, base_dir, "release each task with the runs folder it was trained in "
                                    "(--runs), whose base/ the release holds", role="the released base")
    missing = [task for task, path in adapter_dirs.items() if not (path / ADAPTER_SAFETENSORS_NAME).is_file()]
    if missing:
        raise PushError(f"no {ADAPTER_SAFETENSORS_NAME} in the adapter folder of {', '.join(missing)}: the release "
                        "carries each adapter's weights as saved; re-save them with safetensors")
    heads = {task: extract_head(task, path, records[task])[1] for task, path in adapter_dirs.items()}
    card = build_multi_adapter_card(
        records, repo_id=repo_id, heads=heads, evaluation=evaluation, base_model=base_model, license=license,
        local_roots=[runs_dir.resolve().parent], base_checked=base_checked, remote_code=shares_encoder(base_dir),
    )
    card_text = str(card)
    return release_staged(
        lambda folder: stage_multi_adapter(folder, base_dir, adapter_dirs, repo_id, card_text), runs_dir, repo_id,
        private=private, dry_run=dry_run, token=token, commit_message=commit_message,
        staging_dir=staging_dir if staging_dir is not None else default_multi_adapter_dir(runs_dir),
        endpoint=endpoint,
    )
