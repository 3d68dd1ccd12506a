"""Release a merged causal LM: the merged model at the repository root, each task's privacy record, a card.

    README.md                         the card: privacy statement, merge recipe, evaluation, prompt format
    config.json, model.safetensors, generation_config.json, tokenizer files, mergekit_config.yml
                                      the merged directory's files (mergekit's README replaced)
    dp_selection.json                 a merge tuned by ``hf-dpmerge tune``: its accounted selection
    <task>/dp_privacy.json            each merged adapter's privacy record, byte for byte

Unlike a merged classifier there is no task head: the merged LM is the whole model, loaded by
``AutoModelForCausalLM`` / ``pipeline("text-generation")`` at the root, and every task is asked in its
instruction format (:mod:`hf_dpmerge.data.instructions`). The card's ``base_model_relation`` is ``merge``
(the adapters' deltas merged into the base's weights). Only allow-listed files are released.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from huggingface_hub import ModelCard, ModelCardData

from hf_dpmerge.hub.model_card import CARD_TAGS, MergeRecipe, _common, _fingerprint_text, hub_model_id
from hf_dpmerge.hub.push import PushResult, release_staged
from hf_dpmerge.hub.staging import PushError, check_release_base, load_task_record, place_file
from hf_dpmerge.records.card import render_card
from hf_dpmerge.records.fingerprint import adapter_fingerprint
from hf_dpmerge.records.record import CAUSAL_LM, PRIVACY_RECORD_NAME, PROMPT_COMPLETION, PrivacyRecord
from hf_dpmerge.records.release_files import unlisted_files
from hf_dpmerge.records.selection_record import SelectionRecord, find_selection_record
from hf_dpmerge.records.statement import PrivacyStatement, check_unseeded_release

PIPELINE_TAG = "text-generation"


def is_causal_release(records: Mapping[str, PrivacyRecord]) -> bool:
    """Whether the adapters are causal-LM adapters (all of them); a mixture is refused."""
    kinds = {record.extra.get("model_kind") == CAUSAL_LM for record in records.values()}
    if len(kinds) > 1:
        raise PushError("the adapters mix causal-LM and sequence-classification runs: release them separately")
    return kinds == {True}


def _evaluation_rows(evaluation: Mapping) -> list[list[str]]:
    def share(value) -> str:
        return "–" if value is None else f"{value:.1%}"

    def name(task: str, row: Mapping) -> str:  # † : scored on the verbaliser alone (the template's note)
        return task if row.get("answer_end_scored", True) else f"{task} †"

    return [[name(task, row), row["metric"], "∞" if math.isinf(row["epsilon"]) else f"{row['epsilon']:.3g}",
             f"{row['floor']:.4f}", f"{row['individual']:.4f}", f"{row['merged']:.4f}", share(row["gain_retained"]),
             share(row["retention"]), str(row["num_examples"])] for task, row in evaluation["tasks"].items()]


def causal_model_card(records: Mapping[str, PrivacyRecord], *, repo_id: str, merge: MergeRecipe,
                      evaluation: Mapping | None = None, base_model: str | None = None,
                      license: str = "apache-2.0", local_roots=(), selection: SelectionRecord | None = None,
                      fingerprints: Mapping[str, str] | None = None, base_checked: bool = False) -> ModelCard:
    """The card of a merged causal LM built from the causal-LM adapters whose privacy ``records`` are given;
    ``selection`` (``dp_selection.json`` of ``hf-dpmerge tune``) adds the private choice of the merge's
    hyper-parameters and states the composed total, refused unless the adapters are the ones it was made with
    (``fingerprints``: task → :func:`~hf_dpmerge.records.fingerprint.adapter_fingerprint`); ``base_checked``: every
    record's base fingerprint was checked against the merge's base."""
    hub_base = hub_model_id(base_model or _common([r.extra.get("base_model_hub_id") for r in records.values()]),
                            local_roots)
    data = ModelCardData(license=license, base_model=hub_base, base_model_relation="merge" if hub_base else None,
                         pipeline_tag=PIPELINE_TAG, tags=[*CARD_TAGS, "causal-lm"], library_name="transformers")
    statement = (PrivacyStatement.from_selection(selection, records, fingerprints or {}) if selection is not None
                 else PrivacyStatement.from_records(records))
    return render_card(
        "causal_merged", data, statement, title=repo_id.split("/")[-1], tasks=list(records),
        kind="differentially private (DP-SGD) LoRA adapters" if statement.private else "LoRA adapters",
        base_model=hub_base, method=merge.method, merge_text=merge.text.rstrip() if merge.text else None,
        merge_source=merge.source, fingerprint_text=_fingerprint_text(records, base_checked), evaluation=evaluation,
        evaluation_rows=_evaluation_rows(evaluation) if evaluation else [], repo_id=repo_id,
        verbalisers={task: r.extra.get("verbalisers") or [] for task, r in records.items()},
        completion_tasks=[task for task, r in records.items() if r.extra.get("task_kind") == PROMPT_COMPLETION],
        unended_tasks=[task for task, r in records.items() if not r.answer_end_trained],
        scored_without_end=[task for task, row in (evaluation or {}).get("tasks", {}).items()
                            if row.get("answer_end_scored") is False],
        base_source=_common([r.extra.get("base_model_source") for r in records.values()]),
    )


def _stage(folder: Path, merged_dir: Path, adapters: Mapping[str, Path], card_text: str) -> None:
    for source in sorted(merged_dir.iterdir()):
        if source.is_file() and source.name != "README.md" and not source.name.startswith("."):
            place_file(source, folder / source.name)
    for task, adapter in adapters.items():
        (folder / task).mkdir()
        shutil.copyfile(adapter / PRIVACY_RECORD_NAME, folder / task / PRIVACY_RECORD_NAME)
    (folder / "README.md").write_text(card_text, encoding="utf-8")
    if unlisted := [rel for rel in unlisted_files(folder) if not PurePosixPath(rel).name.startswith(".")]:
        raise PushError(f"the staged release holds files outside the release allow-list: {', '.join(unlisted)}")


def push_merged_causal_lm(
    merged_dir: str | os.PathLike,
    repo_id: str,
    *,
    adapters: Mapping[str, str | os.PathLike],
    evaluation: Mapping | None = None,
    private: bool = True,
    dry_run: bool = False,
    token: str | None = None,
    commit_message: str,
    staging_dir: str | os.PathLike | None = None,
    merge_config: str | os.PathLike | None = None,
    base_model: str | None = None,
    license: str = "apache-2.0",
    endpoint: str | None = None,
    allow_seeded: bool = False,
    runs_base: str | os.PathLike | None = None,
) -> PushResult:
    """Stage the merged causal LM + each task's privacy record + the card, then upload (or, ``dry_run``, keep the
    folder). ``evaluation`` is the causal ``results.json`` of ``hf-dpmerge evaluate`` (``model_kind: causal_lm``).
    A merge chosen by ``hf-dpmerge tune`` (its ``dp_selection.json``) is released under the composed total.
    Seeded adapters or a seeded selection are refused unless ``allow_seeded`` (the card then warns), and so are
    adapters trained on another base than the merge's (:func:`~hf_dpmerge.hub.staging.check_release_base`)."""
    from huggingface_hub.utils import validate_repo_id

    validate_repo_id(repo_id)
    merged_dir = Path(merged_dir)
    if not (merged_dir / "config.json").is_file():
        raise FileNotFoundError(f"merged model directory {merged_dir} has no config.json (run mergekit-yaml first)")
    if evaluation is not None and evaluation.get("model_kind") != CAUSAL_LM:
        raise PushError("--eval_json holds a classifier evaluation: give the causal-LM runs' results.json")
    adapter_dirs = {str(task): Path(path) for task, path in adapters.items()}
    records = {task: load_task_record(task, path) for task, path in adapter_dirs.items()}
    selection = find_selection_record(merged_dir)
    check_unseeded_release(records, allow_seeded, "--allow-seeded", selection)
    local_roots = [merged_dir.resolve().parent, *(p.resolve().parent.parent.parent for p in adapter_dirs.values())]
    card = causal_model_card(
        records, repo_id=repo_id, merge=MergeRecipe.load(merged_dir, merge_config), evaluation=evaluation,
        base_model=base_model, license=license, selection=selection, local_roots=local_roots,
        fingerprints={task: adapter_fingerprint(path) for task, path in adapter_dirs.items()} if selection else None,
        base_checked=check_release_base(merged_dir, records, runs_base, local_roots),
    )
    card_text = str(card)
    return release_staged(
        lambda folder: _stage(folder, merged_dir, adapter_dirs, card_text), merged_dir, repo_id, private=private,
        dry_run=dry_run, token=token, commit_message=commit_message, staging_dir=staging_dir, endpoint=endpoint,
    )
