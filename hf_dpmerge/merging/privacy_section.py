"""The "Differential privacy" section appended to a merged model's README (mergekit's model card).

It states the merge method with its resolved shared parameters and per-model settings, and each input's
(ε, δ) from its privacy record (with per-model YAML overrides applied, and listed), followed by the
composed guarantee of :func:`~hf_dpmerge.records.statement.privacy_statement`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mergekit import merge_methods
from mergekit.config import MergeConfiguration

from hf_dpmerge.merging.inputs import RECORD_OVERRIDES, apply_overrides, input_record, input_settings
from hf_dpmerge.records.record import PrivacyRecord
from hf_dpmerge.records.statement import privacy_statement, privacy_table

HEADING = "## Differential privacy"


def _shared_parameters(config: MergeConfiguration) -> dict[str, Any]:
    try:
        spec = merge_methods.get(config.merge_method).spec
    except RuntimeError:
        return dict(config.parameters or {})
    resolved = {p.name: p.default for p in spec.shared_parameters if not p.required}
    resolved.update(config.parameters or {})
    return resolved


def privacy_section(config: MergeConfiguration) -> str | None:
    """Markdown for the merge ``config``, or None when no input has a privacy record."""
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
    parameters = ", ".join(f"`{key}`={value!r}" for key, value in _shared_parameters(config).items()) or "defaults"
    lines = [HEADING, "", f"Merged with **{config.merge_method}** ({parameters})."]
    if settings_lines:
        lines += ["", "Per-model settings (they override the inputs' privacy-record values):", *settings_lines]
    lines.append("")
    if missing:
        lines += [
            privacy_table(records),
            "",
            f"No privacy record was found for {', '.join(missing)}: the merged model carries **no** "
            f"differential-privacy guarantee.",
        ]
    else:
        lines.append(privacy_statement(records).rstrip())
    return "\n".join(lines) + "\n"


def append_privacy_section(out_path: str | Path, config: MergeConfiguration) -> None:
    """Append :func:`privacy_section` to ``out_path/README.md`` when there is one to state."""
    section = privacy_section(config)
    if section is None:
        return
    readme = Path(out_path) / "README.md"
    text = readme.read_text(encoding="utf-8") if readme.exists() else ""
    readme.write_text(f"{text.rstrip()}\n\n{section}" if text else section, encoding="utf-8")

