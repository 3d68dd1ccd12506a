"""Every model card hf_dpmerge writes, from ``huggingface_hub.ModelCard`` templates in ``card_templates/``.

One template per kind: ``adapter.md`` (a released adapter, federated ones included: the README.md of its
folder and of ``DPSAMTrainer.push_to_hub``), ``merged.md`` (a merged model's Hub card, tuned or not:
:mod:`hf_dpmerge.hub.model_card`, which writes ``multi_adapter.md``'s too), ``causal_merged.md`` (a merged causal LM's:
:mod:`hf_dpmerge.hub.causal_release`) and ``merge_section.md`` (the section appended to mergekit's README:
:mod:`hf_dpmerge.merging.privacy_section`). Each is rendered with one
:class:`~hf_dpmerge.records.statement.PrivacyStatement`, the only source of the card's privacy sentences.
Templates and renderer live here, below training, merging and hub, which all write cards
(tests/workflow/test_import_layers.py).

Local paths never enter a card: the base is named by Hub id (:func:`hub_model_id`) or not at all.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData

from hf_dpmerge.records.record import PRIVACY_RECORD_NAME, PrivacyRecord
from hf_dpmerge.records.statement import FEDERATED_KEY, PrivacyStatement
from hf_dpmerge.utils.adapter_files import ADAPTER_BASE_DIR
from hf_dpmerge.utils.io import is_hub_repo_id, write_text_atomic

TEMPLATES = Path(__file__).with_name("card_templates")
CARD_NAME = "README.md"
PIPELINE_TAG = "text-classification"
ADAPTER_TAGS = ["hf_dpmerge", "differential-privacy", "peft", "lora"]


def hub_model_id(candidate: str | None, local_roots: Sequence[str | os.PathLike] = ()) -> str | None:
    """``candidate`` if it can be a Hub model id, None for local paths (which must not go in a card).

    A relative path such as ``runs/base`` looks like a Hub id; it counts as local when it, or its first
    component, exists under the working directory or one of ``local_roots``.
    """
    if not candidate or not isinstance(candidate, str) or not is_hub_repo_id(candidate):
        return None
    first = candidate.split("/")[0]
    for root in [Path.cwd(), *map(Path, local_roots)]:
        if (root / candidate).exists() or ("/" in candidate and (root / first).is_dir()):
            return None
    return candidate


def render_card(template: str, card_data: ModelCardData, statement: PrivacyStatement, **context: Any) -> ModelCard:
    """``card_templates/<template>.md`` rendered with ``card_data`` (the YAML metadata), ``statement`` and
    ``context``."""
    return ModelCard.from_template(card_data, template_path=str(TEMPLATES / f"{template}.md"), statement=statement,
                                   **context)


def adapter_card(record: PrivacyRecord, name: str, stock_base: bool = False) -> ModelCard:
    """The card of one released adapter: metadata (peft, the base's Hub id when there is one), what it is,
    the privacy statement of its ``record`` (federated ones with both levels) and, with ``stock_base``, how
    stock transformers and peft load it with the base the folder holds beside it."""
    statement = PrivacyStatement.from_record(name, record)
    base = hub_model_id(record.extra.get("base_model_hub_id") or record.base_model)
    data = ModelCardData(library_name="peft", base_model=base, pipeline_tag=PIPELINE_TAG, tags=list(ADAPTER_TAGS))
    return render_card("adapter", data, statement, name=name, base_model=base, record_name=PRIVACY_RECORD_NAME,
                       federated=FEDERATED_KEY in record.extra,
                       stock_base=stock_base)


def merged_adapter_card(method: str, lam: float, inputs: Sequence[tuple[str, float | str]], fingerprint: str,
                        records: Mapping[str, PrivacyRecord], base_model: str | None) -> ModelCard:
    """The card of a factor-space merge of shared-A adapters: what was merged (by name and weight), the shared
    A's fingerprint and the merge's privacy statement (parallel composition of ``records``); an input's role is
    its weight, or a phrase (``safe_merge``'s unwanted inputs)."""
    base = hub_model_id(base_model)
    data = ModelCardData(library_name="peft", base_model=base, tags=[*ADAPTER_TAGS, "merge"])
    roles = [(name, weight if isinstance(weight, str) else f"weight {weight:g}") for name, weight in inputs]
    return render_card("merged_adapter", data, PrivacyStatement.from_records(records), method=method, lam=f"{lam:g}",
                       inputs=roles, fingerprint=fingerprint)


def write_adapter_card(directory: str | os.PathLike, record: PrivacyRecord, name: str | None = None) -> Path:
    """Write :func:`adapter_card` as ``directory/README.md`` (replacing peft's template); ``name`` defaults to
    the record's task, else the folder's name."""
    directory = Path(directory)
    stock_base = (directory / ADAPTER_BASE_DIR / "config.json").is_file()
    card = adapter_card(record, name or record.task or directory.name, stock_base)
    return write_text_atomic(directory / CARD_NAME, str(card))
