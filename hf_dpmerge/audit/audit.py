"""One-run empirical privacy audit of a training configuration (Steinke, Nasr & Jagielski 2023, arXiv:2305.08846).

Draw m random-word canaries, each included in the training set with probability 1/2
(:mod:`hf_dpmerge.audit.canaries`); train once with the given :class:`~hf_dpmerge.DPSAMConfig`; score each canary
by the adapter's loss reduction over its base and guess "in" for the k₊ highest, "out" for the k₋ lowest
(:mod:`hf_dpmerge.audit.membership`); turn the correct guesses into ε_lo at the claimed δ
(:mod:`hf_dpmerge.audit.one_run_bound`). ε_lo above the claimed ε refutes the claim; below it proves nothing.
With ``privacy_unit_column`` set, a canary is a unit of ``rows_per_canary`` rows scored by its rows' mean, so the
audit tests the per-unit claim. See docs/design.md §11.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase

from hf_dpmerge.audit.canaries import make_canaries
from hf_dpmerge.audit.membership import loss_reduction_scores, one_run_guesses
from hf_dpmerge.audit.one_run_bound import epsilon_lower_bound
from hf_dpmerge.data.tasks import TaskSpec
from hf_dpmerge.data.tokenize import tokenize_task
from hf_dpmerge.records.record import PrivacyRecord
from hf_dpmerge.training.cached_prefix import dp_trainer
from hf_dpmerge.training.dp.accounting import resolve_delta
from hf_dpmerge.training.dpsam_config import DPSAMConfig
from hf_dpmerge.utils.io import write_text_atomic


@dataclass
class AuditResult:
    """What one audit run measured; ``delta`` is the δ at which ``epsilon_lower`` is stated."""

    num_canaries: int
    num_included: int
    k_plus: int
    k_minus: int
    num_correct: int
    confidence: float
    delta: float
    epsilon_lower: float
    claimed_epsilon: float
    claimed_delta: float
    canary_length: int
    seed: int
    adapter_dir: str
    rows_per_canary: int = 1
    privacy_record: dict[str, Any] = field(default_factory=dict)
    scores: list[float] = field(default_factory=list)
    included: list[bool] = field(default_factory=list)

    @property
    def num_guesses(self) -> int:
        return self.k_plus + self.k_minus

    def summary(self) -> str:
        claim = "∞ (not private)" if math.isinf(self.claimed_epsilon) else f"{self.claimed_epsilon:.3g}"
        return (
            f"empirical ε lower bound: {self.epsilon_lower:.3f} at {self.confidence:.0%} confidence, "
            f"δ = {self.delta:.3g}\n"
            f"claimed ε: {claim} (δ = {self.claimed_delta:.3g}, from {self.adapter_dir}/dp_privacy.json)\n"
            f"{self.num_correct} of {self.num_guesses} guesses correct (k₊ = {self.k_plus}, k₋ = {self.k_minus}); "
            f"{self.num_included} of {self.num_canaries} canaries trained on"
            f"{'' if self.rows_per_canary == 1 else f' (units of {self.rows_per_canary} rows)'}\n"
            "A lower bound below the claim does not prove the guarantee; one above it refutes the claim "
            f"(at {self.confidence:.0%} confidence)."
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "num_guesses": self.num_guesses}

    def save(self, path: str | os.PathLike) -> Path:
        """Write the result as JSON atomically (temporary file, then rename)."""
        return write_text_atomic(path, json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=True) + "\n")


def audit_training(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    train: datasets.Dataset,
    spec: TaskSpec,
    config: DPSAMConfig,
    *,
    num_canaries: int,
    k_plus: int,
    k_minus: int,
    canary_length: int = 16,
    confidence: float = 0.95,
    seed: int = 0,
    max_length: int = 128,
    adapter_dir: str | os.PathLike | None = None,
    rows_per_canary: int = 1,
    trainer_options: dict[str, Any] | None = None,
) -> AuditResult:
    """Audit ``config`` by training the peft ``model`` once on ``train`` (raw task rows) plus canaries
    (``trainer_options``: :func:`~hf_dpmerge.training.cached_prefix.dp_trainer`'s, e.g. the cached prefix)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    unit = config.privacy_unit_column
    # an example-level claim does not cover a canary of several rows (only group privacy would)
    if rows_per_canary > 1 and unit is None:
        raise ValueError(
            f"canaries of {rows_per_canary} rows audit a per-unit guarantee, but the run is example-level: "
            "set privacy_unit_column (--privacy_unit_column) or use one row per canary"
        )
    if unit is not None and unit not in train.column_names:
        raise ValueError(
            f"privacy_unit_column={unit!r} is not a column of the audited task (columns: {train.column_names})"
        )
    canaries = make_canaries(tokenizer, spec, count=num_canaries, length=canary_length, seed=seed,
                             rows_per_canary=rows_per_canary)
    one_run_guesses(np.zeros(num_canaries), k_plus, k_minus)  # refuse bad k₊/k₋ before training
    keep = (unit,) if unit is not None else ()
    task_rows = tokenize_task(train, spec, tokenizer, max_length=max_length, keep_columns=keep)
    canary_rows = tokenize_task(canaries.examples, spec, tokenizer, max_length=max_length)
    if unit is not None:  # canary j is the unit "hf_dpmerge-canary-j"; task units compared as strings
        task_rows = task_rows.cast_column(unit, datasets.Value("string"))
        canary_rows = canary_rows.add_column(unit, [f"hf_dpmerge-canary-{j}" for j in canaries.canary_of_row])
    canary_rows = canary_rows.cast(task_rows.features)
    scored_rows = canary_rows.remove_columns(list(keep))
    included = canary_rows.select(np.flatnonzero(canaries.included[canaries.canary_of_row]))
    train_set = datasets.concatenate_datasets([task_rows, included])
    # the trainer sets q = B/N from this realised N, which varies with the draw by about √m/2 examples: the claim
    # checked is the accountant's at that N
    collator = DataCollatorWithPadding(tokenizer)
    trainer = dp_trainer(model, config, train_dataset=train_set, data_collator=collator, **(trainer_options or {}))
    trainer.train()
    adapter_dir = Path(adapter_dir if adapter_dir is not None else Path(config.output_dir) / "adapter")
    trainer.save_model(str(adapter_dir))
    record = PrivacyRecord.load(adapter_dir)

    row_scores = loss_reduction_scores(trainer.model, scored_rows, collator)
    scores = row_scores.reshape(num_canaries, rows_per_canary).mean(axis=1)
    guesses = one_run_guesses(scores, k_plus, k_minus)
    correct = int(np.sum((guesses == 1) & canaries.included) + np.sum((guesses == -1) & ~canaries.included))
    delta = record.delta if record.dp else resolve_delta(config.target_delta, record.num_units)
    epsilon_lower = epsilon_lower_bound(
        num_canaries=num_canaries, num_guesses=k_plus + k_minus, num_correct=correct,
        delta=delta, confidence=confidence,
    )
    return AuditResult(
        num_canaries=num_canaries,
        num_included=int(canaries.included.sum()),
        k_plus=k_plus,
        k_minus=k_minus,
        num_correct=correct,
        confidence=confidence,
        delta=delta,
        epsilon_lower=epsilon_lower,
        claimed_epsilon=record.epsilon,
        claimed_delta=record.delta,
        canary_length=canary_length,
        seed=seed,
        adapter_dir=str(adapter_dir),
        rows_per_canary=rows_per_canary,
        privacy_record=record.to_dict(),
        scores=scores.tolist(),
        included=canaries.included.tolist(),
    )
