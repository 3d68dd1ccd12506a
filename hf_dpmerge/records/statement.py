"""The privacy statement quoted by merged-model READMEs and Hub model cards.

Releases trained on disjoint datasets compose in parallel: the set {w_t} is (max_t ε_t, δ)-DP with respect
to one privacy unit's data (each unit lives in one dataset), and merging released weights is
post-processing (DP-Merging paper, §3.1), so the merged model inherits that guarantee.

The statement says what ε covers (docs/design.md §9): the privacy unit of each input (one
training row, or all rows sharing a value of a unit column, e.g. an author) and both neighbouring
relations: ε for add/remove-one (the calibrated one) and for replace-one. A per-row ε does not protect a
person, author or film with many rows: group privacy scales it by up to the number of their rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from hf_dpmerge.records.record import PrivacyRecord


def _format_epsilon(record: PrivacyRecord) -> str:
    return "∞ (not private)" if not record.dp or not math.isfinite(record.epsilon) else f"{record.epsilon:.3g}"


def _format_replace_one(record: PrivacyRecord) -> str:
    if not record.dp or not math.isfinite(record.epsilon):
        return "∞"
    return "not computed" if record.epsilon_replace_one is None else f"{record.epsilon_replace_one:.3g}"


def describe_unit(record: PrivacyRecord) -> str:
    """What one privacy unit of ``record`` is, in words."""
    column = record.unit_column
    if column is None:
        return "one training example (row)"
    return f"all training rows sharing one value of `{column}`"


def privacy_table(records: Mapping[str, PrivacyRecord]) -> str:
    """A markdown table: one row per input with (ε add/remove-one, δ, accountant, N rows, steps, σ, sam mode,
    ε replace-one, privacy unit, N units)."""
    lines = [
        (
            "| input | ε (add/remove-one) | δ | accountant | N rows | steps | σ (effective) | SAM mode | "
            "ε (replace-one) | privacy unit | N units |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rec in records.items():
        delta = f"{rec.delta:.3g}" if rec.dp else "–"
        lines.append(
            f"| {name} | {_format_epsilon(rec)} | {delta} | {rec.accountant if rec.dp else '–'} | "
            f"{rec.num_samples} | {rec.steps} | {rec.effective_noise_multiplier:.4g} | {rec.sam_mode} | "
            f"{_format_replace_one(rec)} | {rec.privacy_unit} | {rec.num_units} |"
        )
    return "\n".join(lines)


def privacy_scope(records: Mapping[str, PrivacyRecord]) -> str:
    """What ε covers: per which unit, under which neighbouring relation, and what it does not protect."""
    units = sorted({describe_unit(r) for r in records.values()})
    unit_text = "; ".join(units)
    example_level = any(r.unit_column is None for r in records.values())
    text = (
        f"**What ε covers.** The privacy unit is {unit_text}. ε (add/remove-one) bounds what the release "
        "reveals about whether one unit's data was in the training set; ε (replace-one) bounds what it "
        "reveals when one unit's data is swapped for other data (both computed by an accountant for the same "
        "run; replace-one is the larger)."
    )
    if example_level:
        text += (
            " Where the unit is one row, a person, author or other entity with several rows is protected "
            "only by group privacy (for k rows, roughly k·ε at k·e^{(k−1)ε}·δ), which is weak: train with "
            "`privacy_unit_column` set to their id for a per-entity guarantee."
        )
    return text


def privacy_statement(records: Mapping[str, PrivacyRecord]) -> str:
    """Markdown: the table plus the composed guarantee of the merged model."""
    if not records:
        raise ValueError("no privacy records to state a guarantee from")
    table = privacy_table(records)
    if not all(r.dp and math.isfinite(r.epsilon) for r in records.values()):
        claim = (
            "At least one input was trained **without differential privacy**: the merged model carries "
            "**no** differential-privacy guarantee."
        )
    else:
        eps = max(r.epsilon for r in records.values())
        delta = max(r.delta for r in records.values())
        claim = (
            f"Each input was trained with DP-SGD on its own dataset. If the datasets are disjoint (each "
            f"individual's data lies in one of them), releasing all inputs is **({eps:.3g}, {delta:.3g})-DP** "
            f"by parallel composition (max ε_t, max δ_t; add/remove-one), and the merge is post-processing of "
            f"released weights, so the merged model is ({eps:.3g}, {delta:.3g})-DP as well. If one unit "
            f"contributes to several datasets, the ε of those datasets add up for that unit."
        )
        replace = [r.epsilon_replace_one for r in records.values()]
        if all(value is not None for value in replace):
            claim += f" Under replace-one neighbours the same holds with ε = {max(replace):.3g}."
        claim += "\n\n" + privacy_scope(records)
    return f"{table}\n\n{claim}\n"


def seeded_inputs(records: Mapping[str, PrivacyRecord]) -> tuple[list[str], list[str]]:
    """The private inputs whose sampling and noise were seeded (``dp_seed``), and those whose record predates
    the ``seeded`` field (may have been seeded)."""
    private = {name: rec for name, rec in records.items() if rec.dp}
    return (
        [name for name, rec in private.items() if rec.seeded],
        [name for name, rec in private.items() if rec.seeded is None],
    )


def check_unseeded_release(records: Mapping[str, PrivacyRecord], allow_seeded: bool, flag: str) -> None:
    """Refuse to release seeded inputs (or inputs of unknown seeding) unless ``allow_seeded``; ``flag`` is
    the option that opts in, named in the error."""
    seeded, unknown = seeded_inputs(records)
    if allow_seeded or not (seeded or unknown):
        return
    reasons = []
    if seeded:
        reasons.append(f"{', '.join(seeded)} trained with a fixed dp_seed")
    if unknown:
        reasons.append(
            f"{', '.join(unknown)} have privacy records written before hf_dpmerge recorded seeding (no 'seeded' "
            "field), so they may have been seeded"
        )
    raise ValueError(
        f"refusing to release: {'; '.join(reasons)}. Anyone holding the seed can regenerate the Poisson masks and "
        f"the noise and subtract it, which undoes the differential privacy; retrain without dp_seed, or pass "
        f"{flag} to release anyway (the card then says so)"
    )


def seeded_warning(records: Mapping[str, PrivacyRecord]) -> str:
    """Markdown warning naming the seeded inputs (empty when there are none)."""
    seeded, unknown = seeded_inputs(records)
    if not (seeded or unknown):
        return ""
    names = ", ".join(f"`{n}`" for n in seeded + unknown)
    return (
        f"**Seeded training: {names}.** These inputs were trained with a fixed `dp_seed` (or their record "
        "predates the `seeded` field and they may have been): anyone holding the seed can regenerate the "
        "sampling masks and the noise and undo it, so for them the (ε, δ) guarantee holds only against someone "
        "who does not know the seed.\n"
    )


def public_eval_note(records: Mapping[str, PrivacyRecord]) -> str:
    """Markdown note naming the inputs whose training evaluated or selected the model on data declared
    public (empty when there are none)."""
    public = [name for name, rec in records.items() if rec.eval_data_is_public]
    if not public:
        return ""
    return (
        f"**Evaluation data declared public: {', '.join(f'`{n}`' for n in public)}.** These inputs were "
        "evaluated (and possibly selected: best checkpoint, early stopping) during training on data their "
        "trainer declared public (`eval_data_is_public`); the guarantee does not cover that data.\n"
    )
