"""The Hub model card of a merged private model: metadata, per-task privacy, merge recipe, evaluation.

Rendered by :func:`hf_dpmerge.records.card.render_card` from the ``merged`` template
(``hf_dpmerge/records/card_templates/merged.md``) with ``ModelCardData`` (``base_model`` +
``base_model_relation: merge`` when the base is a Hub id, ``datasets`` where a record names its Hub dataset
(``extra.dataset_hub_id``: GLUE tasks), ``pipeline_tag``, ``tags``, ``eval_results``). Every privacy sentence
is the :class:`~hf_dpmerge.records.statement.PrivacyStatement` of the records (composed with the selection of
a tuned merge); the card never computes privacy itself. The evaluation is read through
:class:`hf_dpmerge.analysis.evaluation_report.EvaluationReport`, the type ``hf-dpmerge evaluate`` writes. Local paths
never enter the card.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from hf_dpmerge.analysis.evaluation_report import COLUMN_LABELS, EvaluationReport
from hf_dpmerge.records.card import PIPELINE_TAG, hub_model_id, render_card
from hf_dpmerge.records.record import PrivacyRecord
from hf_dpmerge.records.selection_record import SelectionRecord
from hf_dpmerge.records.statement import PrivacyStatement
from hf_dpmerge.records.statement_prose import number

CARD_TAGS = ["hf_dpmerge", "differential-privacy", "merge", "mergekit", "peft", "lora"]
MERGEKIT_CONFIG_NAME = "mergekit_config.yml"


@dataclass
class HeadInfo:
    """What the card says about one task's classifier head (the release's ``<task>/`` subfolder)."""

    task: str
    num_labels: int | None = None
    label_names: list[str] | None = None
    keys: list[str] = field(default_factory=list)


@dataclass
class MergeRecipe:
    """The merge configuration as mergekit wrote it (``mergekit_config.yml``), its comments left out (a card
    quotes configuration, not notes: :func:`without_comments`)."""

    text: str | None
    method: str | None
    source: str | None

    @classmethod
    def load(cls, merged_dir: str | os.PathLike | None, merge_config: str | os.PathLike | None = None):
        """Read ``merge_config`` if given, else ``merged_dir/mergekit_config.yml`` if present."""
        if merge_config is not None:
            path = Path(merge_config)
            if not path.is_file():
                raise FileNotFoundError(f"merge config {path} does not exist")
        elif merged_dir is not None and (Path(merged_dir) / MERGEKIT_CONFIG_NAME).is_file():
            path = Path(merged_dir) / MERGEKIT_CONFIG_NAME
        else:
            return cls(text=None, method=None, source=None)
        text = path.read_text(encoding="utf-8")
        data = _load_yaml(text)
        method = data.get("merge_method") if isinstance(data, dict) else None
        return cls(text=without_comments(text, data), method=None if method is None else str(method),
                   source=path.name)


def _load_yaml(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"merge config is not valid YAML ({err})") from None


def _comment_start(line: str) -> int | None:
    """Where ``line``'s comment starts: its first ``#`` at the line's start or after white space (YAML's rule)
    outside a quoted scalar (one opened after white space, ``[``, ``{`` or ``,``; ``\\x`` escapes in double
    quotes, ``''`` in single ones); None without a comment."""
    quote, i = None, 0
    while i < len(line):
        char, previous = line[i], line[i - 1] if i else " "
        if (quote == '"' and char == "\\") or (quote == "'" and line.startswith("''", i)):
            i += 1  # the escaped character is skipped
        elif quote is not None:
            quote = None if char == quote else quote
        elif char in "'\"" and previous in " \t[{,":
            quote = char
        elif char == "#" and previous in " \t":
            return i
        i += 1
    return None


def without_comments(text: str, data: Any) -> str:
    """YAML ``text`` (whose loaded value is ``data``) without its comments, its layout kept: every line cut at
    :func:`_comment_start`, a line that was only a comment dropped. Where the cut changes what the YAML says (a
    block or multi-line quoted scalar holding " #"), ``data`` dumped instead, which has no comments either."""
    import yaml

    lines = []
    for line in text.splitlines():
        start = _comment_start(line)
        kept = line if start is None else line[:start].rstrip()
        if kept or start is None:
            lines.append(kept)
    stripped = "\n".join(lines).strip("\n") + "\n"
    try:
        if yaml.safe_load(stripped) == data:
            return stripped
    except yaml.YAMLError:
        pass
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


DATASET_KEY = "dataset_hub_id"  # a record's extra: the Hub dataset it trained on, when there is one (GLUE)


def _eval_results(evaluation: EvaluationReport | None, datasets: Mapping[str, str | None]) -> list[EvalResult] | None:
    if evaluation is None:
        return None
    return [
        EvalResult(task_type=PIPELINE_TAG, dataset_type=datasets.get(t.task) or t.task, dataset_name=t.task,
                   dataset_config=t.task if datasets.get(t.task) else None, dataset_split=evaluation.split,
                   metric_type=t.metric, metric_value=t.merged)
        for t in evaluation.tasks
    ]


def _evaluation_columns(evaluation: EvaluationReport) -> tuple[list[tuple[str, str]], list[list[str]]]:
    """The card's evaluation table: its columns after ``task`` as (label, definition), from the report's
    :meth:`~hf_dpmerge.analysis.evaluation_report.EvaluationReport.definitions` (what evaluate's legend prints),
    and one row of cells per task."""
    def score(value: float | None) -> str:
        return "–" if value is None else f"{value:.4f}"

    definitions = evaluation.definitions()
    rows = []
    for t in evaluation.tasks:
        cells = {
            "metric": t.metric, "epsilon": number(t.epsilon), "floor": score(t.floor),
            "individual": score(t.individual), "merged": score(t.merged),
            "gain_retained": "below floor" if t.below_floor else "–" if math.isnan(t.gain_retained)
            else f"{t.gain_retained:.1%}",
            "retention": "–" if math.isnan(t.retention) else f"{t.retention:.1%}",
            "interference": f"{t.interference:+.4f}", "own_head": score(t.own_head),
            "num_examples": str(t.num_examples),
        }
        rows.append([t.task, *(cells[key] for key in definitions)])
    return [(COLUMN_LABELS[key], text) for key, text in definitions.items()], rows


def _fingerprint_text(records: Mapping[str, PrivacyRecord], base_checked: bool) -> str | None:
    """What the card says of the adapters' base fingerprints; that they match the merge's base only when
    ``base_checked`` (:func:`hf_dpmerge.hub.staging.check_release_base` checked every one against it)."""
    hashes = {t: r.base_model_hash.split(":")[-1][:16] for t, r in records.items() if r.base_model_hash}
    if base_checked and len(set(hashes.values())) == 1 and len(hashes) == len(records):
        return (f"All adapters record the same base fingerprint (`base_model_hash`, SHA-256 over the base tensors "
                f"they modify): `{next(iter(hashes.values()))}…`, that of the base this model was merged from "
                "(checked when the release was staged).")
    if hashes:
        checked = ("each checked against the base this model was merged from" if base_checked
                   else "not checked against the base this model was merged from")
        return (f"Base fingerprints recorded by the adapters (`base_model_hash`, SHA-256 over the base tensors each "
                f"modifies; adapters modifying different tensors differ; {checked}): "
                + ", ".join(f"`{t}`: `{h}…`" for t, h in hashes.items()) + ".")
    return None


def _common(values: Sequence[Any]) -> Any:
    distinct = {v for v in values if v is not None}
    return next(iter(distinct)) if len(distinct) == 1 else None


def build_model_card(
    records: Mapping[str, PrivacyRecord],
    *,
    repo_id: str | None = None,
    merge: MergeRecipe | None = None,
    heads: Mapping[str, HeadInfo] | None = None,
    evaluation: EvaluationReport | None = None,
    base_model: str | None = None,
    license: str = "apache-2.0",
    local_roots: Sequence[str | os.PathLike] = (),
    selection: SelectionRecord | None = None,
    fingerprints: Mapping[str, str] | None = None,
    shared_encoder: bool = False,
    base_checked: bool = False,
) -> ModelCard:
    """The Hub card of a merged model built from the adapters whose privacy ``records`` are given.

    ``base_model`` (else the records' common ``extra.base_model_hub_id``, the encoder training started from,
    else their common ``base_model``) is named only if it can be a Hub id (see
    :func:`hub_model_id`, relative paths being looked up under ``local_roots``): a local path never enters
    the card.
    ``selection`` (``dp_selection.json`` of ``hf-dpmerge tune``) adds the private hyper-parameter selection
    and the composed total, refused unless the adapters are the ones it was made with (``fingerprints``: task →
    :func:`~hf_dpmerge.records.fingerprint.adapter_fingerprint`). ``shared_encoder``: the release stages the merged
    encoder once at its root and each ``<task>/`` folder holds only its head
    (:func:`hf_dpmerge.modeling.stock_release.write_task_head_folder`). ``base_checked``: every record's base
    fingerprint was checked against the merge's base (the card then says so).
    """
    if not records:
        raise ValueError("a model card needs the privacy record of at least one adapter")
    merge = merge or MergeRecipe(text=None, method=None, source=None)
    tasks = list(records)
    recorded = _common([r.extra.get("base_model_hub_id") for r in records.values()]) or _common(
        [r.base_model for r in records.values()])
    hub_base = hub_model_id(base_model or recorded, local_roots)
    task_datasets = {t: r.extra.get(DATASET_KEY) for t, r in records.items()}
    datasets = sorted({d for d in task_datasets.values() if d})
    title = repo_id.split("/")[-1] if repo_id else "Differentially private merged model"
    card_data = ModelCardData(
        license=license,
        base_model=hub_base,
        base_model_relation="merge" if hub_base else None,
        datasets=datasets or None,
        pipeline_tag=PIPELINE_TAG,
        tags=list(CARD_TAGS),
        library_name="transformers",
        model_name=title if evaluation is not None else None,
        eval_results=_eval_results(evaluation, task_datasets),
    )
    statement = (PrivacyStatement.from_selection(selection, records, fingerprints or {}) if selection is not None
                 else PrivacyStatement.from_records(records))
    columns, rows = _evaluation_columns(evaluation) if evaluation is not None else ([], [])
    return render_card(
        "merged",
        card_data,
        statement,
        title=title,
        tasks=tasks,
        kind="differentially private (DP-SGD) LoRA adapters" if statement.private else "LoRA adapters",
        base_model=hub_base,
        method=merge.method,
        merge_text=merge.text.rstrip() if merge.text is not None else None,
        merge_source=merge.source,
        fingerprint_text=_fingerprint_text(records, base_checked),
        heads=list((heads or {}).values()),
        evaluation=evaluation,
        evaluation_columns=columns,
        evaluation_rows=rows,
        repo_id=repo_id,
        usage_task=next(iter(heads)) if heads and repo_id else None,
        shared_encoder=shared_encoder,
    )
