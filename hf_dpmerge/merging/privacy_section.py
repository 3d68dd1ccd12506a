"""The "Differential privacy" section of a merged model's README (mergekit's model card).

It states the merge method with its resolved shared parameters and per-model settings, then the
:class:`~hf_dpmerge.records.statement.PrivacyStatement` of the inputs' privacy records (per-model YAML
overrides applied, and listed) — composed with the private selection when ``hf-dpmerge tune`` chose the
merge, the inputs then named by their runs and checked to be the adapters the selection was made with
(:func:`tuned_statement`). Rendered from the ``merge_section`` template (:func:`hf_dpmerge.records.card.render_card`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from huggingface_hub import ModelCardData
from mergekit import merge_methods
from mergekit.config import MergeConfiguration

from hf_dpmerge.merging.inputs import (
    RECORD_OVERRIDES,
    apply_overrides,
    input_record,
    input_run,
    input_settings,
    task_adapters,
)
from hf_dpmerge.records.card import CARD_NAME, render_card
from hf_dpmerge.records.fingerprint import adapter_fingerprint
from hf_dpmerge.records.record import PrivacyRecord
from hf_dpmerge.records.selection_record import SelectionRecord
from hf_dpmerge.records.statement import PrivacyStatement
from hf_dpmerge.utils.quiet import hub_errors_only

HEADING = "## Differential privacy"


def _shared_parameters(config: MergeConfiguration) -> dict[str, Any]:
    try:
        spec = merge_methods.get(config.merge_method).spec
    except RuntimeError:
        return dict(config.parameters or {})
    resolved = {p.name: p.default for p in spec.shared_parameters if not p.required}
    resolved.update(config.parameters or {})
    return resolved


def tuned_statement(config: MergeConfiguration, selection: SelectionRecord) -> PrivacyStatement:
    """The statement of the merge ``config`` chosen by ``selection``: each input named by its run and stated from
    the run's adapter (record and fingerprint), which must be one the selection was made with
    (:meth:`PrivacyStatement.from_selection`); an input outside a runs layout cannot be matched and is refused."""
    if unmatched := [str(ref) for ref, _, base in input_settings(config) if ref != base and input_run(ref) is None]:
        raise ValueError(f"merge inputs {', '.join(unmatched)} are not runs' adapters (<runs>/<task>/encoder_adapter "
                         "or adapter, beside <runs>/<task>/adapter/dp_privacy.json): they cannot be matched to the "
                         "adapters the private selection was made with")
    adapters = task_adapters(config)
    return PrivacyStatement.from_selection(selection, {task: PrivacyRecord.load(a) for task, a in adapters.items()},
                                           {task: adapter_fingerprint(a) for task, a in adapters.items()})


def privacy_section(config: MergeConfiguration, selection: SelectionRecord | None = None) -> str | None:
    """Markdown for the merge ``config`` (chosen by ``selection`` when tuned), or None when no input has a
    privacy record."""
    records: dict[str, PrivacyRecord] = {}
    missing: list[str] = []
    settings_lines: list[str] = []
    for reference, settings, base in input_settings(config):
        if reference == base:
            continue
        record = input_record(reference)
        if settings:
            listed = ", ".join(f"`{key}`={value!r}" for key, value in settings.items())
            settings_lines.append(f"- {reference}: {listed}")
        if record is None:
            missing.append(str(reference))
            continue
        overrides = {
            key: value for key, value in settings.items()
            if key in RECORD_OVERRIDES and isinstance(value, (bool, int, float, str))
        }
        records[str(reference)] = apply_overrides(record, overrides)
    if not records:
        return None
    if selection is not None and not missing:
        statement = tuned_statement(config, selection)
    else:
        statement = PrivacyStatement.from_records(records, tuple(missing))
    parameters = ", ".join(f"`{key}`={value!r}" for key, value in _shared_parameters(config).items()) or "defaults"
    with hub_errors_only():  # a section, not a card: it has no metadata block
        card = render_card("merge_section", ModelCardData(), statement, method=config.merge_method,
                           parameters=parameters, settings_lines=settings_lines)
    return card.text.strip() + "\n"


def write_privacy_section(out_path: str | Path, config: MergeConfiguration,
                          selection: SelectionRecord | None = None) -> None:
    """Put :func:`privacy_section` at the end of ``out_path/README.md`` when there is one to state, replacing
    the section an earlier call wrote (``hf-dpmerge tune`` restates it with the selection)."""
    section = privacy_section(config, selection)
    if section is None:
        return
    readme = Path(out_path) / CARD_NAME
    text = readme.read_text(encoding="utf-8") if readme.exists() else ""
    text = text.split(f"\n{HEADING}\n", 1)[0] if not text.startswith(HEADING) else ""
    readme.write_text(f"{text.rstrip()}\n\n{section}" if text.strip() else section, encoding="utf-8")
