"""The record of a private merge selection (``dp_selection.json``) and its composition with the adapters'.

``hf-dpmerge tune`` spends ε_sel (pure ε-DP) on the validation data to pick one candidate; the adapters, on
disjoint task datasets, compose in parallel to (max_t ε_t, max_t δ_t). With the selection (docs/design.md §13):
``sequential`` (the default: validation and training data may share individuals) gives
(max_t ε_t + ε_sel, max_t δ_t); ``parallel`` (opt-in, disjoint individuals) (max(max_t ε_t, ε_sel), max_t δ_t).
The unit is each task's adapter's (:mod:`hf_dpmerge.training.dp.private_selection`). Only the candidates, the choice,
the public validation sizes and the accounting are stored, never scores or private sizes. The total covers the
adapters the choice was made with only: :meth:`SelectionRecord.released_guarantee` refuses others by their
fingerprints (by each task's (ε, δ) in records of schema ≤ 3); schema 1 records are refused.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hf_dpmerge.records.record import EXAMPLE_UNIT, UNIT_PREFIX, PrivacyRecord
from hf_dpmerge.utils.io import write_text_atomic

SELECTION_RECORD_NAME = "dp_selection.json"
COMPOSITIONS = ("sequential", "parallel")
SELECTION_SCHEMA_VERSION = 4


def composed_guarantee(records: Mapping[str, PrivacyRecord], selection_epsilon: float, composition: str
                       ) -> tuple[float, float]:
    """(ε, δ) of the adapters plus the selection under ``composition`` (module docstring); ε = ∞ if any is non-DP."""
    if composition not in COMPOSITIONS:
        raise ValueError(f"--composition must be one of {COMPOSITIONS}, got {composition!r}")
    if not records:
        raise ValueError("no adapter records to compose the selection with")
    if not all(r.dp and math.isfinite(r.epsilon) for r in records.values()):
        return math.inf, max(r.delta for r in records.values())
    adapters_epsilon = max(r.epsilon for r in records.values())
    delta = max(r.delta for r in records.values())
    if composition == "sequential":
        return adapters_epsilon + selection_epsilon, delta
    return max(adapters_epsilon, selection_epsilon), delta


def selection_unit(units: dict[str, str], rows_per_unit: int) -> str:
    """The selection's unit in words, from each task's privacy unit (``"example"`` or ``"unit:<column>"``)."""
    if all(unit == EXAMPLE_UNIT for unit in units.values()):
        return "validation example"
    parts = [f"{task}: one example" if unit == EXAMPLE_UNIT else
             f"{task}: all rows sharing one value of `{unit.removeprefix(UNIT_PREFIX)}`, at most {rows_per_unit} "
             "of them scored" for task, unit in units.items()]
    return f"validation unit ({'; '.join(parts)})"


@dataclass
class SelectionRecord:
    """One private selection among candidate merges, and the guarantee it composes to with the adapters'.

    ``candidates`` holds each candidate's grid settings; ``chosen`` indexes it. ``validation_size`` holds the
    public n_t per task (the subsample size and denominator; never the private set's size); ``sensitivity`` is
    Δ of the utility and ``relation`` the neighbouring relations under which ε_sel holds. ``adapters`` holds
    each task's (ε, δ). ``seeded`` is True when a fixed seed drew the subsamples and the mechanism's noise (whoever
    holds it can recompute them: no privacy against them), False when they came from OS entropy, None when not
    recorded (schema 2): possibly seeded. ``units`` maps each task to the privacy unit its validation rows were
    grouped by, its adapter's (``"example"`` or ``"unit:<column>"``; empty in records written before: every task
    per example), and ``rows_per_unit`` is m, the public cap on one unit's scored rows. ``fingerprints`` maps each
    task to the :func:`~hf_dpmerge.records.fingerprint.adapter_fingerprint` of the adapter selected with (empty in
    records of schema ≤ 3).
    """

    mechanism: str
    epsilon: float
    sensitivity: float
    utility: str
    relation: str
    unit: str
    composition: str
    candidates: list[dict[str, Any]]
    chosen: int
    validation_size: dict[str, int]
    adapters: dict[str, dict[str, float]]
    total_epsilon: float
    total_delta: float
    delta: float = 0.0
    seeded: bool | None = None
    units: dict[str, str] = field(default_factory=dict)
    rows_per_unit: int = 1
    fingerprints: dict[str, str] = field(default_factory=dict)
    schema_version: int = SELECTION_SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def released_guarantee(self, records: Mapping[str, PrivacyRecord], fingerprints: Mapping[str, str]
                           ) -> tuple[float, float]:
        """The (ε, δ) of releasing the adapters ``records`` (task → record; ``fingerprints``: task → adapter
        fingerprint) under this selection: the stored total when they are the adapters selected with (the same
        tasks, each with its recorded fingerprint), else refused. Without fingerprints (schema ≤ 3): the same tasks
        with the recorded (ε, δ) each, and max(stored, :func:`composed_guarantee` of ``records``)."""
        if self.fingerprints:
            selected, released = self.fingerprints, dict(fingerprints)
        else:
            selected = {task: (value["epsilon"], value["delta"]) for task, value in self.adapters.items()}
            released = {task: (r.epsilon if r.dp else math.inf, r.delta) for task, r in records.items()}
        differs = f"{'fingerprint' if self.fingerprints else '(ε, δ)'} differs from the adapter selected with"
        problems = [f"{task}: " + ("not released" if task not in released else
                                   "not selected with" if task not in selected else differs)
                    for task in sorted(selected.keys() | released.keys()) if selected.get(task) != released.get(task)]
        if problems:
            raise ValueError(
                f"the adapters released are not the ones {SELECTION_RECORD_NAME} chose the merge with: "
                f"{'; '.join(problems)}. Its ε_sel and total do not cover this release: re-run hf-dpmerge tune (or "
                "evolve) with the adapters to release"
            )
        if self.fingerprints:
            return self.total_epsilon, self.total_delta
        epsilon, delta = composed_guarantee(records, self.epsilon, self.composition)
        return max(epsilon, self.total_epsilon), max(delta, self.total_delta)

    def save(self, directory: str | os.PathLike) -> Path:
        text = json.dumps(asdict(self), indent=2, allow_nan=True) + "\n"
        return write_text_atomic(Path(directory) / SELECTION_RECORD_NAME, text)

    @classmethod
    def load(cls, path: str | os.PathLike) -> SelectionRecord:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
            if data.get("schema_version", 0) > SELECTION_SCHEMA_VERSION:
                raise ValueError(f"schema {data['schema_version']} is newer than this hf_dpmerge understands")
            if data.get("schema_version", 0) < 2:
                raise ValueError("schema 1 took Δ from the private validation sizes, which does not bound ε_sel "
                                 "for 3 or more tasks")
            # schema 2: seeded unknown (None); schemas 2–3: no fingerprints
            return cls(**{**data, "schema_version": SELECTION_SCHEMA_VERSION})
        except (ValueError, TypeError, AttributeError) as err:
            raise ValueError(f"{path}: unreadable selection record ({err}); re-run hf-dpmerge tune") from None


def find_selection_record(directory: str | os.PathLike) -> SelectionRecord | None:
    """The selection record in ``directory`` if there is one (``hf-dpmerge tune`` writes it into its output)."""
    path = Path(directory) / SELECTION_RECORD_NAME
    return SelectionRecord.load(path) if path.is_file() else None
