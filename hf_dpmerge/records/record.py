"""The machine-readable privacy record released beside every adapter (``dp_privacy.json``).

The record is the contract between training, merging and release: the DP-aware merge reads the noise
left in each task vector from it (``noise_multiplier``, ``max_grad_norm``, ``expected_batch_size``,
``sum_lr_squared``, ``optimizer``), the merge checks ``base_model_hash`` against its base, and model
cards quote ``epsilon``/``delta``/``accountant``/``num_samples`` and what ε covers (``privacy_unit``,
``num_units``, ``neighbouring_relation``, ``epsilon_replace_one``; docs/design.md §9).

Schema history: 1 had no unit or relation fields. A schema-1 record is read as what its training was:
example-level (one row is the unit, ``num_units = num_samples``), ε under add/remove-one, and its ε under
replace-one unknown (``epsilon_replace_one = None``); it is upgraded to schema 2 on loading.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from hf_dpmerge.utils.io import write_text_atomic

PRIVACY_RECORD_NAME = "dp_privacy.json"
CAUSAL_LM = "causal_lm"  # extra["model_kind"] of a causal-LM adapter (examples/train_causal_lm.py); else a classifier
PROMPT_COMPLETION = "prompt_completion"  # extra["task_kind"] of a causal-LM adapter trained on prompt → completion rows
SCHEMA_VERSION = 2
EXAMPLE_UNIT = "example"
UNIT_PREFIX = "unit:"
ADD_REMOVE_ONE = "add/remove-one"
REPLACE_ONE = "replace-one"
_SCHEMA_2_KEYS = ("privacy_unit", "num_units", "neighbouring_relation", "epsilon_replace_one")


def privacy_unit_name(column: str | None) -> str:
    """``"example"`` (one training row) or ``"unit:<column>"`` (all rows sharing one value of ``column``)."""
    return EXAMPLE_UNIT if column is None else f"{UNIT_PREFIX}{column}"


class PrivacyRecordError(ValueError):
    """A privacy record is missing, unreadable, from a newer schema, or inconsistent."""


@dataclass
class PrivacyRecord:
    """What a released adapter's training spent and how, enough to re-run its accountant.

    ``noise_multiplier`` is σ per privatised query; ``effective_noise_multiplier`` is the σ of the single
    subsampled Gaussian step that one iteration amounts to (σ/√2 for ``two_query``, σ otherwise).
    ``sum_lr_squared`` is Σ_t η_t² over the optimizer steps taken. ``dp`` is False for non-private
    baselines, whose ``epsilon`` is ``inf``. ``base_model_hash`` is :func:`~hf_dpmerge.records.fingerprint.
    base_fingerprint` of the base tensors named in ``base_model_hash_tensors`` (those the adapter modifies).
    ``seeded`` is True when ``dp_seed`` fixed the sampling and noise streams (whoever holds the seed can
    regenerate and subtract the noise), False when they came from OS entropy, and None in records written
    before it was recorded (schema 1): unknown, so treated as possibly seeded. ``eval_data_is_public`` is
    True when the run evaluated or selected its model during training on data declared public.
    ``resumed_from_steps`` are the steps of the checkpoints the run was resumed from, in order (empty: never
    resumed; records written before the field read as empty). An unseeded run draws fresh sampling and noise
    after each, so runs resumed from one checkpoint share only the steps before it (docs/design.md §3).

    What ε covers: ``privacy_unit`` is ``"example"`` (one training row) or ``"unit:<column>"`` (every row
    sharing one value of that column, e.g. an author id: user-level DP); ``num_units`` is the number of such
    units (q = ``expected_batch_size``/``num_units``). ``epsilon`` holds for datasets differing by one unit
    under ``neighbouring_relation`` (add/remove-one: present or absent); ``epsilon_replace_one`` is the same
    run's ε when one unit's data is replaced by other data, always from the PLD accountant (None: not computed,
    schema-1 records); with ``accountant="rdp"`` the looser RDP ``epsilon`` can exceed it.
    """

    epsilon: float
    delta: float
    accountant: str
    noise_multiplier: float
    effective_noise_multiplier: float
    sample_rate: float
    steps: int
    max_grad_norm: float
    expected_batch_size: int
    num_samples: int
    sam_mode: str
    sam_rho: float
    align_lambda: float
    optimizer: dict[str, Any]
    sum_lr_squared: float
    base_model: str | None
    base_model_hash: str | None
    versions: dict[str, str]
    base_model_hash_tensors: list[str] = field(default_factory=list)
    dp: bool = True
    queries_per_step: int = 1
    task: str | None = None
    privacy_unit: str = EXAMPLE_UNIT
    num_units: int | None = None
    neighbouring_relation: str = ADD_REMOVE_ONE
    epsilon_replace_one: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    seeded: bool | None = None
    eval_data_is_public: bool = False
    resumed_from_steps: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def answer_end_trained(self) -> bool:
        """Whether a causal adapter learnt the end of sequence after its verbaliser (``extra["train_answer_end"]``;
        records written before that option did): where it did not, it is scored on the verbaliser alone."""
        return bool(self.extra.get("train_answer_end", True))

    @property
    def unit_column(self) -> str | None:
        """The column whose values are the privacy units, or None for example-level records."""
        return self.privacy_unit.removeprefix(UNIT_PREFIX) if self.privacy_unit != EXAMPLE_UNIT else None

    def validate(self) -> None:
        """Raise :class:`PrivacyRecordError` when a field is out of its domain."""
        if self.num_units is None and self.privacy_unit == EXAMPLE_UNIT:
            self.num_units = self.num_samples
        scope = {
            "privacy_unit": self.privacy_unit == EXAMPLE_UNIT
            or (self.privacy_unit.startswith(UNIT_PREFIX) and len(self.privacy_unit) > len(UNIT_PREFIX)),
            "neighbouring_relation": self.neighbouring_relation == ADD_REMOVE_ONE,
            "num_units": isinstance(self.num_units, int) and 0 < self.num_units <= max(self.num_samples, 1),
        }
        bad_scope = [name for name, ok in scope.items() if not ok]
        if bad_scope:
            values = ", ".join(f"{name}={getattr(self, name)!r}" for name in bad_scope)
            raise PrivacyRecordError(f"privacy record has invalid values: {values}")
        if not self.dp:
            return
        checks = {
            "epsilon": math.isfinite(self.epsilon) and self.epsilon > 0,
            "delta": 0 < self.delta < 1,
            "noise_multiplier": math.isfinite(self.noise_multiplier) and self.noise_multiplier >= 0,
            "effective_noise_multiplier": math.isfinite(self.effective_noise_multiplier)
            and self.effective_noise_multiplier >= 0,
            "sample_rate": 0 < self.sample_rate <= 1,
            "steps": self.steps >= 0,
            "max_grad_norm": math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0,
            "expected_batch_size": self.expected_batch_size > 0,
            "num_samples": self.num_samples > 0,
            "sum_lr_squared": math.isfinite(self.sum_lr_squared) and self.sum_lr_squared >= 0,
            "epsilon_replace_one": self.epsilon_replace_one is None or self.epsilon_replace_one > 0,
            "resumed_from_steps": all(0 <= step <= self.steps for step in self.resumed_from_steps),
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            values = ", ".join(f"{name}={getattr(self, name)!r}" for name in bad)
            raise PrivacyRecordError(f"privacy record has invalid values: {values}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>") -> PrivacyRecord:
        if not isinstance(data, dict):
            raise PrivacyRecordError(f"{source}: a privacy record must be a JSON object")
        version = data.get("schema_version")
        if not isinstance(version, int):
            raise PrivacyRecordError(f"{source}: privacy record has no integer 'schema_version'")
        if version > SCHEMA_VERSION:
            raise PrivacyRecordError(
                f"{source}: privacy record schema {version} is newer than this hf_dpmerge understands "
                f"({SCHEMA_VERSION}); upgrade hf_dpmerge"
            )
        known = {f.name for f in fields(cls)}
        required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
        if version >= 2:
            required |= set(_SCHEMA_2_KEYS)
        else:
            data = {**data, "schema_version": SCHEMA_VERSION}  # example-level, add/remove-one (see module doc)
        missing = sorted(n for n in required if n not in data)
        if missing:
            raise PrivacyRecordError(f"{source}: privacy record lacks keys {missing}")
        unknown = sorted(set(data) - known)
        if unknown:
            raise PrivacyRecordError(f"{source}: privacy record has unknown keys {unknown}")
        try:
            return cls(**data)
        except PrivacyRecordError as err:
            raise PrivacyRecordError(f"{source}: {err}") from None
        except TypeError as err:
            raise PrivacyRecordError(f"{source}: malformed privacy record ({err})") from None

    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``dp_privacy.json`` into ``directory`` atomically (temporary file, then rename)."""
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=True) + "\n"
        return write_text_atomic(Path(directory) / PRIVACY_RECORD_NAME, text)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> PrivacyRecord:
        """Read ``directory/dp_privacy.json`` (or the file itself), with errors naming the problem."""
        path = Path(directory)
        if path.is_dir():
            path = path / PRIVACY_RECORD_NAME
        if not path.exists():
            raise PrivacyRecordError(f"no privacy record at {path}: train the adapter with DPSAMTrainer")
        try:
            data = json.loads(path.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise PrivacyRecordError(f"{path}: corrupt privacy record ({err})") from None
        return cls.from_dict(data, source=str(path))


def find_privacy_record(directory: str | os.PathLike) -> PrivacyRecord | None:
    """The record in ``directory`` if one is there, else None (corrupt records still raise)."""
    path = Path(directory) / PRIVACY_RECORD_NAME
    return PrivacyRecord.load(path) if path.exists() else None
