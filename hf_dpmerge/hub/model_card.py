"""The Hub model cards of ``hf-dpmerge push``: a merged private model's (metadata, per-task privacy, merge recipe,
evaluation) and a multi-adapter release's (:func:`build_multi_adapter_card`).

Rendered by :func:`hf_dpmerge.records.card.render_card` from the ``merged`` (``multi_adapter``) template
(``hf_dpmerge/records/card_templates/``) with ``ModelCardData`` (``base_model`` + ``base_model_relation: merge``
(``adapter``) when the base is a Hub id, ``datasets`` where a record names its Hub dataset
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
from hf_dpmerge.records.card import ADAPTER_TAGS, PIPELINE_TAG, hub_model_id, render_card
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


def _eval_results(evaluation: EvaluationReport | None, datasets: Mapping[str, str | None],
                  column: str = "merged") -> list[EvalResult] | None:
    """The card metadata's scores: each task's ``column`` of the report (the model the card releases)."""
    if evaluation is None:
        return None
    return [
        EvalResult(task_type=PIPELINE_TAG, dataset_type=datasets.get(t.task) or t.task, dataset_name=t.task,
                   dataset_config=t.task if datasets.get(t.task) else None, dataset_split=evaluation.split,
                   metric_type=t.metric, metric_value=getattr(t, column))
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


def _fingerprint_text(records: Mapping[str, PrivacyRecord], base_checked: bool,
                      base: str = "the base this model was merged from") -> str | None:
    """What the card says of the adapters' base fingerprints; that they match ``base`` (the merge's, or the one a
    multi-adapter release holds) only when ``base_checked`` (every one was checked against it when staging)."""
    hashes = {t: r.base_model_hash.split(":")[-1][:16] for t, r in records.items() if r.base_model_hash}
    if base_checked and len(set(hashes.values())) == 1 and len(hashes) == len(records):
        return (f"All adapters record the same base fingerprint (`base_model_hash`, SHA-256 over the base tensors "
                f"they modify): `{next(iter(hashes.values()))}…`, that of {base} "
                "(checked when the release was staged).")
    if hashes:
        checked = f"each checked against {base}" if base_checked else f"not checked against {base}"
        return (f"Base fingerprints recorded by the adapters (`base_model_hash`, SHA-256 over the base tensors each "
                f"modifies; adapters modifying different tensors differ; {checked}): "
                + ", ".join(f"`{t}`: `{h}…`" for t, h in hashes.items()) + ".")
    return None


def _common(values: Sequence[Any]) -> Any:
    distinct = {v for v in values if v is not None}
    return next(iter(distinct)) if len(distinct) == 1 else None


def _card_data(records: Mapping[str, PrivacyRecord], *, title: str, evaluation: EvaluationReport | None,
               base_model: str | None, license: str, local_roots: Sequence[str | os.PathLike], relation: str,
               tags: list[str], library: str, column: str) -> tuple[ModelCardData, str | None]:
    """A card's metadata and the base's Hub id (``base_model``, else the records' common
    ``extra.base_model_hub_id``, else their common ``base_model``; None where it cannot be a Hub id:
    :func:`hub_model_id`, relative paths looked up under ``local_roots``, so a local path never enters the card).
    ``relation``: how the release derives from that base; ``column``: the evaluation column it scores."""
    recorded = _common([r.extra.get("base_model_hub_id") for r in records.values()]) or _common(
        [r.base_model for r in records.values()])
    hub_base = hub_model_id(base_model or recorded, local_roots)
    task_datasets = {t: r.extra.get(DATASET_KEY) for t, r in records.items()}
    datasets = sorted({d for d in task_datasets.values() if d})
    card_data = ModelCardData(
        license=license,
        base_model=hub_base,
        base_model_relation=relation if hub_base else None,
        datasets=datasets or None,
        pipeline_tag=PIPELINE_TAG,
        tags=tags,
        library_name=library,
        model_name=title if evaluation is not None else None,
        eval_results=_eval_results(evaluation, task_datasets, column),
    )
    return card_data, hub_base


def _render(template: str, card_data: ModelCardData, statement: PrivacyStatement,
            records: Mapping[str, PrivacyRecord], *, title: str, hub_base: str | None,
            evaluation: EvaluationReport | None, **context: Any) -> ModelCard:
    """``template`` rendered with what every release card states (its tasks, the kind of adapters, the base, the
    evaluation table of :func:`_evaluation_columns`) and ``context``."""
    columns, rows = _evaluation_columns(evaluation) if evaluation is not None else ([], [])
    return render_card(
        template, card_data, statement, title=title, tasks=list(records),
        kind="differentially private (DP-SGD) LoRA adapters" if statement.private else "LoRA adapters",
        base_model=hub_base, evaluation=evaluation, evaluation_columns=columns, evaluation_rows=rows, **context,
    )


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

    ``base_model`` is named as :func:`_card_data` says (never a local path).
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
    title = repo_id.split("/")[-1] if repo_id else "Differentially private merged model"
    card_data, hub_base = _card_data(records, title=title, evaluation=evaluation, base_model=base_model,
                                     license=license, local_roots=local_roots, relation="merge",
                                     tags=list(CARD_TAGS), library="transformers", column="merged")
    statement = (PrivacyStatement.from_selection(selection, records, fingerprints or {}) if selection is not None
                 else PrivacyStatement.from_records(records))
    return _render(
        "merged", card_data, statement, records, title=title, hub_base=hub_base, evaluation=evaluation,
        method=merge.method,
        merge_text=merge.text.rstrip() if merge.text is not None else None,
        merge_source=merge.source,
        fingerprint_text=_fingerprint_text(records, base_checked),
        heads=list((heads or {}).values()),
        repo_id=repo_id,
        usage_task=next(iter(heads)) if heads and repo_id else None,
        shared_encoder=shared_encoder,
    )


def label_groups(heads: Mapping[str, HeadInfo]) -> dict[int, list[str]]:
    """The tasks by their heads' number of labels, in order: peft mixes adapters in one batch within a group only
    (it keeps a copy of the base's head per adapter and stacks the rows' outputs)."""
    groups: dict[int, list[str]] = {}
    for task, info in heads.items():
        groups.setdefault(int(info.num_labels or 0), []).append(task)
    return groups


def build_multi_adapter_card(
    records: Mapping[str, PrivacyRecord],
    *,
    repo_id: str,
    heads: Mapping[str, HeadInfo],
    evaluation: EvaluationReport | None = None,
    base_model: str | None = None,
    license: str = "apache-2.0",
    local_roots: Sequence[str | os.PathLike] = (),
    base_checked: bool = False,
    remote_code: bool = False,
) -> ModelCard:
    """The Hub card of a multi-adapter release (:mod:`hf_dpmerge.hub.multi_adapter`): the base once and every task's
    adapter under ``<task>/``; each task's own guarantee and the release's (parallel composition, nothing merged);
    its metadata scores the evaluation's ``individual`` column, which the release computes; how stock peft loads
    one task and a mixed batch of the largest group of tasks with as many labels (:func:`label_groups`).
    ``remote_code``: the base pools by the mean through the shipped remote code. ``base_model`` as in
    :func:`_card_data`; ``base_checked`` as in :func:`build_model_card`, against the base released."""
    if not records:
        raise ValueError("a model card needs the privacy record of at least one adapter")
    title = repo_id.split("/")[-1]
    card_data, hub_base = _card_data(records, title=title, evaluation=evaluation, base_model=base_model,
                                     license=license, local_roots=local_roots, relation="adapter",
                                     tags=[*ADAPTER_TAGS, "multi-adapter"], library="peft", column="individual")
    statement = PrivacyStatement.from_records(records, merged=False)
    groups = label_groups(heads)
    mixed = max((tasks for tasks in groups.values() if len(tasks) > 1), key=len, default=None)
    usage_task = mixed[0] if mixed else next(iter(heads))
    return _render(
        "multi_adapter", card_data, statement, records, title=title, hub_base=hub_base, evaluation=evaluation,
        task_guarantees=[(t, PrivacyStatement.from_record(t, r).guarantee()) for t, r in records.items()],
        fingerprint_text=_fingerprint_text(records, base_checked, "the base this repository holds"),
        heads=list(heads.values()),
        repo_id=repo_id,
        usage_task=usage_task,
        usage_labels=repr(dict(enumerate(heads[usage_task].label_names or []))),
        mixed=mixed,
        groups=groups,
        remote_code=remote_code,
    )
