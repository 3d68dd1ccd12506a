"""The one privacy statement every model card quotes: :class:`PrivacyStatement`.

A card (adapter, merged, tuned, federated; :mod:`hf_dpmerge.records.card`) states privacy only through a statement
built from the records, so every ε it prints is a recorded or composed value and it states one final (ε, δ): one
adapter's record (every phase its accountant composed); a merge of releases on disjoint datasets,
(max_t ε_t, max_t δ_t) per privacy unit, merging being post-processing (DP-Merging paper, §3.1); a tuned merge,
the selection record's total for the adapters it was made with (docs/design.md §13); a federated adapter, its
example-level guarantee with the client-level one beside it. What ε covers (the privacy unit, add/remove-one
and replace-one, the training set as split): docs/design.md §9 and docs/privacy.md. This module composes ε;
the sentences and tables a card prints are :mod:`hf_dpmerge.records.statement_prose`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hf_dpmerge.records.record import ADD_REMOVE_ONE, EXAMPLE_UNIT, UNIT_PREFIX, PrivacyRecord
from hf_dpmerge.records.selection_record import SelectionRecord
from hf_dpmerge.records.statement_prose import StatementProse

FEDERATED_KEY = "federated"  # PrivacyRecord.extra key of a federated global adapter's two levels


@dataclass(frozen=True)
class PhasePrivacy:
    """One stretch of DP-SGD steps at one (σ_eff, q) that an adapter's accountant composed: an entry of
    ``dp_privacy.json``'s ``extra["phases"]`` (private LP-FT: ``head``, then ``lora``), else the record's own steps.
    ε is the accountant's over every phase in order, so a card states them all."""

    name: str
    steps: int
    sigma: float
    sample_rate: float
    expected_batch_size: int

    @classmethod
    def from_record(cls, record: PrivacyRecord) -> tuple[PhasePrivacy, ...]:
        """The record's phases (``extra["phases"]``), else its steps at its (σ_eff, q) as one phase."""
        phases = record.extra.get("phases") or [{
            "name": "training", "steps": record.steps, "effective_noise_multiplier": record.effective_noise_multiplier,
            "sample_rate": record.sample_rate, "expected_batch_size": record.expected_batch_size}]
        return tuple(cls(name=str(p["name"]), steps=int(p["steps"]), sigma=float(p["effective_noise_multiplier"]),
                         sample_rate=float(p["sample_rate"]), expected_batch_size=int(p["expected_batch_size"]))
                     for p in phases)


@dataclass(frozen=True)
class InputPrivacy:
    """One adapter's accounted training as its ``dp_privacy.json`` states it: ε under each relation and every
    phase its accountant composed (``phases``, σ the effective one; none for a non-private input)."""

    name: str
    dp: bool
    epsilon: float
    delta: float
    epsilon_replace_one: float | None
    accountant: str
    num_samples: int
    num_units: int | None
    unit_column: str | None
    sam_mode: str
    seeded: bool | None
    eval_data_is_public: bool
    phases: tuple[PhasePrivacy, ...] = ()
    labels_from_private_data: bool = False
    """Whether its label names were read off the private training rows (``--label_names_from_private_data``)."""
    carved_splits: tuple[str, ...] = ()
    """The held-out splits carved from its own training rows because the dataset had none."""

    @classmethod
    def from_record(cls, name: str, record: PrivacyRecord) -> InputPrivacy:
        private = record.dp and math.isfinite(record.epsilon)
        return cls(
            name=name, dp=private, epsilon=record.epsilon if private else math.inf, delta=record.delta,
            epsilon_replace_one=record.epsilon_replace_one if private else math.inf, accountant=record.accountant,
            num_samples=record.num_samples, num_units=record.num_units, unit_column=record.unit_column,
            sam_mode=record.sam_mode, seeded=record.seeded, eval_data_is_public=record.eval_data_is_public,
            phases=PhasePrivacy.from_record(record) if private else (),
            labels_from_private_data=bool(record.extra.get("label_names_private", False)),
            carved_splits=tuple(record.extra.get("carved_splits") or ()),
        )

    @property
    def unit(self) -> str:
        """What one privacy unit is, in words."""
        if self.unit_column is None:
            return "one training example (row)"
        return f"all training rows sharing one value of `{self.unit_column}`"


@dataclass(frozen=True)
class SelectionPrivacy:
    """The private choice of the merge hyper-parameters (a ``dp_selection.json``): its ε_sel and how it composes."""

    mechanism: str
    epsilon: float
    sensitivity: float
    utility: str
    relation: str
    unit: str
    composition: str
    num_candidates: int
    chosen: dict[str, Any]
    validation_size: dict[str, int]
    """The public validation size n_t of each task (never the private sizes)."""
    generations: int = 1
    """How many choices the selection made (``hf-dpmerge evolve``: one per generation, ε_sel/G each), else 1."""
    seeded: bool | None = None
    """Whether a fixed seed drew the subsamples and the mechanism's noise (None: not recorded, possibly)."""


@dataclass(frozen=True)
class PrivacyStatement(StatementProse):
    """The privacy a release states: ONE final (``epsilon``, ``delta``) under ``relation`` per ``unit``
    (``epsilon_replace_one`` under replace-one, None when not computed), how it arose from its ``inputs``
    (``composition``: ``"single"``, ``"parallel"`` across adapters, ``"sequential"``/``"parallel"`` with a
    ``selection``), and the inputs' own accounting (accountant, every phase's σ, q and steps, seeding) for the
    tables.

    ``missing`` names merge inputs without a record (then there is no guarantee). ``adapters_epsilon`` /
    ``adapters_delta`` are the adapters' composition when it is a component of a larger total (a tuned merge).
    ``client_level`` is a federated run's guarantee for a client's whole data; ``steps_accounted`` says which
    steps its example-level ε counts. ``merged`` False: the inputs are released side by side, unmerged (a
    multi-adapter release), under the same parallel composition.
    """

    epsilon: float
    delta: float
    relation: str
    epsilon_replace_one: float | None
    inputs: tuple[InputPrivacy, ...]
    composition: str
    missing: tuple[str, ...] = ()
    selection: SelectionPrivacy | None = None
    adapters_epsilon: float | None = None
    adapters_delta: float | None = None
    client_level: dict[str, Any] | None = None
    steps_accounted: str | None = None
    merged: bool = True

    # ------------------------------------------------------------------------------------------ construction

    @classmethod
    def from_record(cls, name: str, record: PrivacyRecord) -> PrivacyStatement:
        """One adapter: its record's guarantee (a federated global adapter's adds the client level)."""
        item = InputPrivacy.from_record(name, record)
        federated = record.extra.get(FEDERATED_KEY)
        return cls(
            epsilon=item.epsilon, delta=item.delta, relation=ADD_REMOVE_ONE,
            epsilon_replace_one=item.epsilon_replace_one, inputs=(item,), composition="single",
            client_level=federated.get("client_level") if federated else None,
            steps_accounted=federated["example_level"].get("steps_accounted") if federated else None,
        )

    @classmethod
    def from_records(cls, records: Mapping[str, PrivacyRecord], missing: tuple[str, ...] = (),
                     merged: bool = True) -> PrivacyStatement:
        """A merge of the adapters whose ``records`` are given (``merged`` False: the adapters side by side):
        parallel composition, (max_t ε_t, max_t δ_t)."""
        if not records:
            raise ValueError("no privacy records to state a guarantee from")
        inputs = tuple(InputPrivacy.from_record(name, record) for name, record in records.items())
        private = all(item.dp for item in inputs) and not missing
        replace = [item.epsilon_replace_one for item in inputs]
        return cls(
            epsilon=max(item.epsilon for item in inputs) if private else math.inf,
            delta=max(item.delta for item in inputs), relation=ADD_REMOVE_ONE,
            epsilon_replace_one=(max(replace) if None not in replace else None) if private else math.inf,
            inputs=inputs, composition="parallel", missing=tuple(missing), merged=merged,
        )

    @classmethod
    def from_selection(cls, selection: SelectionRecord, records: Mapping[str, PrivacyRecord],
                       fingerprints: Mapping[str, str]) -> PrivacyStatement:
        """A tuned merge of the adapters ``records`` (task → record; ``fingerprints``: task → adapter fingerprint):
        the selection's composed total, the adapters' composition one component of it. Refused when they are not
        the adapters the selection was made with (:meth:`SelectionRecord.released_guarantee`), or when an adapter
        is user-level and the selection was not made per that unit (records written before selections bounded a
        unit's rows): its ε_sel would hold per validation row only."""
        epsilon, delta = selection.released_guarantee(records, fingerprints)
        adapters = cls.from_records(records)
        per_row = ({item.unit_column for item in adapters.inputs} - {None}
                   - {unit.removeprefix(UNIT_PREFIX) for unit in selection.units.values() if unit != EXAMPLE_UNIT})
        if per_row:
            raise ValueError(
                f"the adapters' privacy unit is {', '.join(f'unit:{c}' for c in sorted(per_row))} (user-level) but "
                "dp_selection.json made its selection per validation example, so one unit's validation rows may cost "
                "ε_sel each; re-run hf-dpmerge tune/evolve, which scores at most --rows_per_unit rows of each unit"
            )
        return cls(
            epsilon=epsilon, delta=delta, relation=ADD_REMOVE_ONE,
            epsilon_replace_one=None, inputs=adapters.inputs, composition=selection.composition,
            selection=SelectionPrivacy(
                mechanism=selection.mechanism, epsilon=selection.epsilon, sensitivity=selection.sensitivity,
                utility=selection.utility, relation=selection.relation, unit=selection.unit,
                composition=selection.composition, num_candidates=len(selection.candidates),
                chosen=dict(selection.candidates[selection.chosen]), validation_size=dict(selection.validation_size),
                generations=int(selection.extra.get("generations", 1)), seeded=selection.seeded,
            ),
            adapters_epsilon=adapters.epsilon, adapters_delta=adapters.delta,
        )

    # ------------------------------------------------------------------------------------------ facts

    @property
    def private(self) -> bool:
        return math.isfinite(self.epsilon)

    @property
    def unit(self) -> str:
        """The privacy unit(s) of the inputs, in words."""
        return "; ".join(sorted({item.unit for item in self.inputs}))

    @property
    def seeded(self) -> list[str]:
        """The private inputs whose noise was seeded, or whose record predates the ``seeded`` field."""
        return [item.name for item in self.inputs if item.dp and item.seeded is not False]


def seeded_inputs(records: Mapping[str, PrivacyRecord]) -> tuple[list[str], list[str]]:
    """The private inputs whose sampling and noise were seeded (``dp_seed``), and those whose record predates
    the ``seeded`` field (may have been seeded)."""
    private = {name: rec for name, rec in records.items() if rec.dp}
    return (
        [name for name, rec in private.items() if rec.seeded],
        [name for name, rec in private.items() if rec.seeded is None],
    )


def check_unseeded_release(records: Mapping[str, PrivacyRecord], allow_seeded: bool, flag: str,
                           selection: SelectionRecord | None = None) -> None:
    """Refuse to release seeded inputs (or inputs of unknown seeding), or a merge chosen by a seeded private
    ``selection`` (or one of unknown seeding), unless ``allow_seeded``; ``flag`` is the option that opts in, named
    in the error."""
    seeded, unknown = seeded_inputs(records)
    seeded_selection = selection is not None and selection.seeded is not False
    if allow_seeded or not (seeded or unknown or seeded_selection):
        return
    problems = []
    if seeded or unknown:
        reasons = []
        if seeded:
            reasons.append(f"{', '.join(seeded)} trained with a fixed dp_seed")
        if unknown:
            reasons.append(
                f"{', '.join(unknown)} have privacy records written before hf_dpmerge recorded seeding (no 'seeded' "
                "field), so they may have been seeded"
            )
        problems.append(f"{'; '.join(reasons)}. Anyone holding the seed can regenerate the Poisson masks and the "
                        "noise and subtract it, which undoes the differential privacy; retrain without dp_seed")
    if seeded_selection:
        reason = ("the merge was selected with a fixed --seed" if selection.seeded else "the merge's "
                  "dp_selection.json was written before hf_dpmerge recorded seeding (no 'seeded' field), so its "
                  "selection may have been seeded")
        problems.append(f"{reason}. Anyone holding the seed can redraw the validation subsamples and the "
                        "mechanism's noise and read from the choice which candidate scored best, which undoes the "
                        "selection's differential privacy; re-run hf-dpmerge tune/evolve without --seed")
    raise ValueError(
        f"refusing to release: {'. Also: '.join(problems)}, or pass {flag} to release anyway (the card then says so)"
    )
