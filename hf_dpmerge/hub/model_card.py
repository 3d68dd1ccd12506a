"""The Hub model card of a merged private model: metadata, per-task privacy, merge recipe, evaluation.

The card quotes each task's (ε, δ, accountant, N) from its ``dp_privacy.json`` and the composed guarantee
from :func:`hf_dpmerge.privacy.statement.privacy_statement`; it never computes privacy itself. The
evaluation file written by ``hf-dpmerge evaluate`` is rendered generically (one row per task, one column
per scalar key found), so new or missing keys never break a release.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData

from hf_dpmerge.privacy.record import PrivacyRecord
from hf_dpmerge.privacy.statement import privacy_statement

CARD_TAGS = ["hf_dpmerge", "differential-privacy", "merge", "lora"]
MERGEKIT_CONFIG_NAME = "mergekit_config.yml"

# Keys of an evaluation file that hold aggregates rather than a task.
_SUMMARY_KEYS = ("average", "averages", "avg", "mean", "overall", "summary")
# Keys under which an evaluation file may nest its per-task results.
_ROW_CONTAINER_KEYS = ("tasks", "per_task", "results", "rows")
# Keys naming the task inside a row of a list-shaped evaluation file.
_ROW_NAME_KEYS = ("task", "name", "dataset")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$|^[A-Za-z0-9][\w.-]*$")


@dataclass
class HeadInfo:
    """What the card says about one task's classifier head (the release's ``<task>/`` subfolder)."""

    task: str
    num_labels: int | None = None
    label_names: list[str] | None = None
    keys: list[str] = field(default_factory=list)


@dataclass
class MergeRecipe:
    """The merge configuration as mergekit wrote it (``mergekit_config.yml``), verbatim."""

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
        return cls(text=text, method=_merge_method(text), source=path.name)


def _merge_method(text: str) -> str | None:
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"merge config is not valid YAML ({err})") from None
    if not isinstance(data, dict):
        return None
    method = data.get("merge_method")
    return str(method) if method is not None else None


def hub_model_id(candidate: str | None, local_roots: Sequence[str | os.PathLike] = ()) -> str | None:
    """``candidate`` if it can be a Hub model id, None for local paths (which must not go in metadata).

    A relative path such as ``runs/base`` looks like a Hub id; it counts as local when it, or its first
    component, exists under the working directory or one of ``local_roots``.
    """
    if not candidate or not isinstance(candidate, str) or not _HUB_ID.match(candidate):
        return None
    first = candidate.split("/")[0]
    for root in [Path.cwd(), *map(Path, local_roots)]:
        if (root / candidate).exists() or ("/" in candidate and (root / first).is_dir()):
            return None
    return candidate


def load_eval_json(path: str | os.PathLike) -> Any:
    """Read the evaluation file, with errors naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"evaluation file {path} does not exist")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: corrupt evaluation JSON ({err})") from None


# ---------------------------------------------------------------------------------------------- evaluation


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _flatten(row: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, prefix=f"{name}."))
        elif _is_scalar(value):
            flat[name] = value
    return flat


def _rows_from_list(items: Sequence[Any]) -> list[tuple[str, dict[str, Any]]]:
    rows = []
    for index, item in enumerate(items):
        if not isinstance(item, Mapping):
            continue
        name_key = next((k for k in _ROW_NAME_KEYS if isinstance(item.get(k), str)), None)
        name = item[name_key] if name_key else str(index)
        rows.append((name, _flatten({k: v for k, v in item.items() if k != name_key})))
    return rows


def evaluation_rows(
    data: Any, tasks: Sequence[str] = ()
) -> tuple[list[tuple[str, dict[str, Any]]], list[tuple[str, dict[str, Any]]], dict[str, Any]]:
    """Split an evaluation file into (task rows, summary rows, other scalar entries).

    Accepted shapes: ``{task: {...}, "average": {...}}``; the same nested under ``tasks``/``per_task``/
    ``results``/``rows`` (a mapping or a list of rows with a ``task`` key); or a bare list of rows. When
    ``tasks`` are given, mapping keys that name one of them are preferred as rows.
    """
    if isinstance(data, list):
        return _rows_from_list(data), [], {}
    if not isinstance(data, Mapping):
        return [], [], {}
    container_key = next((k for k in _ROW_CONTAINER_KEYS if isinstance(data.get(k), (Mapping, list))), None)
    rest = {k: v for k, v in data.items() if k != container_key}
    summary = []
    for key, value in rest.items():
        if key.lower() in _SUMMARY_KEYS:
            if isinstance(value, Mapping):
                summary.append((key, _flatten(value)))
            elif _is_scalar(value):
                summary.append((key, {"value": value}))
    others = {k: v for k, v in rest.items() if _is_scalar(v) and k.lower() not in _SUMMARY_KEYS}
    for key, value in rest.items():  # text-only mappings (e.g. definitions of the columns) read as notes
        if isinstance(value, Mapping) and value and all(isinstance(v, str) for v in value.values()):
            others.update({f"{key}.{k}": v for k, v in value.items()})
    if container_key is not None:
        source = data[container_key]
        rows = _rows_from_list(source) if isinstance(source, list) else [
            (str(k), _flatten(v)) for k, v in source.items() if isinstance(v, Mapping)
        ]
        return rows, summary, others
    candidates = {k: v for k, v in rest.items() if isinstance(v, Mapping) and k.lower() not in _SUMMARY_KEYS}
    named = [k for k in candidates if k in set(tasks)]
    keys = named or list(candidates)
    return [(k, _flatten(candidates[k])) for k in keys], summary, others


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "∞" if value > 0 else "-∞"
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def evaluation_table(data: Any, tasks: Sequence[str] = ()) -> str:
    """Markdown for an evaluation file: a per-task table (missing keys shown as –) plus other entries."""
    rows, summary, others = evaluation_rows(data, tasks)
    if not rows and not summary:
        text = json.dumps(data, indent=2, sort_keys=True, default=str, allow_nan=True)
        if len(text) > 4000:
            text = text[:4000] + "\n…"
        return f"The evaluation file has no per-task rows; its content:\n\n```json\n{text}\n```\n"
    columns: list[str] = []
    for _, row in rows + summary:
        columns += [c for c in row if c not in columns]
    lines = ["| task | " + " | ".join(_cell(c) for c in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name, row in rows:
        lines.append(f"| {_cell(name)} | " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
    for name, row in summary:
        lines.append(f"| **{_cell(name)}** | " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
    text = "\n".join(lines) + "\n"
    if others:
        text += "\n" + "\n".join(f"- {_cell(k)}: {_cell(v)}" for k, v in others.items()) + "\n"
    return text


# ---------------------------------------------------------------------------------------------- the card


def _common(values: Sequence[Any]) -> Any:
    distinct = {v for v in values if v is not None}
    return next(iter(distinct)) if len(distinct) == 1 else None


def _usage(repo_id: str, heads: Mapping[str, HeadInfo]) -> str:
    task = next(iter(heads))
    return f"""Each task is a complete model in its own subfolder (merged encoder + the task's head and labels).
It reads the masked token mean, as in training, through the `modeling_mean_pooling_bert.py` shipped with
it, hence `trust_remote_code=True` (without it transformers refuses the model instead of misreading it):

```python
from transformers import pipeline

classify = pipeline("text-classification", model="{repo_id}", model_kwargs={{"subfolder": "{task}"}},
                    trust_remote_code=True)
```
"""


def build_model_card(
    records: Mapping[str, PrivacyRecord],
    *,
    repo_id: str | None = None,
    merge: MergeRecipe | None = None,
    heads: Mapping[str, HeadInfo] | None = None,
    eval_results: Any = None,
    base_model: str | None = None,
    license: str = "apache-2.0",
    local_roots: Sequence[str | os.PathLike] = (),
) -> ModelCard:
    """The Hub card of a merged model built from the adapters whose privacy ``records`` are given.

    ``base_model`` goes into the metadata only if it can be a Hub id (else only the body names it);
    without it, the records' common ``base_model`` is used on the same terms, relative paths being
    looked up under ``local_roots`` (see :func:`hub_model_id`).
    """
    if not records:
        raise ValueError("a model card needs the privacy record of at least one adapter")
    merge = merge or MergeRecipe(text=None, method=None, source=None)
    heads = dict(heads or {})
    tasks = list(records)
    recorded_base = _common([r.base_model for r in records.values()])
    named_base = base_model or recorded_base
    metadata = ModelCardData(
        license=license,
        base_model=hub_model_id(named_base, local_roots),
        tags=list(CARD_TAGS),
        library_name="transformers",
    )
    title = repo_id.split("/")[-1] if repo_id else "Differentially private merged model"
    all_private = all(r.dp and math.isfinite(r.epsilon) for r in records.values())
    kind = "differentially private (DP-SGD) LoRA adapters" if all_private else "LoRA adapters"
    base_text = f" on top of the base model `{named_base}`" if named_base else ""
    method_text = f" with mergekit's `{merge.method}` method" if merge.method else ""

    parts = [f"# {title}\n"]
    parts.append(
        f"This model merges {len(tasks)} {kind}{base_text}{method_text}, one per task: "
        + ", ".join(f"`{t}`" for t in tasks)
        + ". The adapters were trained, merged and released with `hf_dpmerge`. "
        "The shared encoder is the merge; each task keeps its own classifier head: the subfolder `<task>/` "
        "holds the task's model (label spaces differ between tasks), next to the task's privacy record "
        "`dp_privacy.json`.\n"
    )
    parts.append("## Privacy\n")
    parts.append(
        "Per task, as recorded at training time in `dp_privacy.json` (ε, δ, the accountant that computed "
        "them, and N, the number of training examples):\n"
    )
    parts.append(privacy_statement(records))
    hashes = {t: r.base_model_hash.split(":")[-1][:16] for t, r in records.items() if r.base_model_hash}
    if hashes and len(set(hashes.values())) == 1 and len(hashes) == len(records):
        parts.append(
            f"All adapters record the same base fingerprint (`base_model_hash`, SHA-256 over the base tensors "
            f"they modify): `{next(iter(hashes.values()))}…`.\n"
        )
    elif hashes:
        parts.append(
            "Base fingerprints recorded by the adapters (`base_model_hash`, SHA-256 over the base tensors each "
            "modifies; adapters modifying different tensors differ): "
            + ", ".join(f"`{t}`: `{h}…`" for t, h in hashes.items())
            + ".\n"
        )
    parts.append(
        "**Not covered by the guarantee.** The guarantee covers the released weights (the merged encoder and "
        "the per-task heads). "
        "It does not cover anything else computed on private data: the evaluation numbers below, training "
        "diagnostics (losses, gradient norms, alignment or merge diagnostics) and any hyper-parameter selection "
        "done on private data each release information outside (ε, δ). Publish them only for public "
        "evaluation data, or account for them separately.\n"
    )
    parts.append("## Merge\n")
    if merge.text is not None:
        parts.append(
            f"Method: `{merge.method or 'unknown'}`. The configuration `{merge.source}`, verbatim:\n\n"
            f"```yaml\n{merge.text.rstrip()}\n```\n"
        )
    else:
        parts.append("No merge configuration was found next to the merged model.\n")
    if heads:
        parts.append("## Heads\n")
        parts.append("| task | labels | label names |\n|---|---|---|")
        for task, head in heads.items():
            names = ", ".join(head.label_names) if head.label_names else "–"
            labels = head.num_labels if head.num_labels is not None else "–"
            parts.append(f"| {task} | {labels} | {_cell(names)} |")
        parts.append("")
    parts.append("## Evaluation\n")
    if eval_results is not None:
        parts.append(
            "As written by `hf-dpmerge evaluate` (individual: the task's own adapter; merged: the merged encoder "
            "with the task's head; retention = merged / individual). – marks a value the file does not have.\n"
        )
        parts.append(evaluation_table(eval_results, tasks))
    else:
        parts.append("No evaluation results were given.\n")
    if heads and repo_id:
        parts.append("## Usage\n")
        parts.append(_usage(repo_id, heads))
    body = "\n".join(parts)
    return ModelCard(f"---\n{metadata.to_yaml()}\n---\n\n{body}", ignore_metadata_errors=False)
