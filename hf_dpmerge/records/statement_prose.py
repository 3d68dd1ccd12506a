"""The prose of the privacy statement every card quotes: :class:`StatementProse`, the markdown sentences and tables
of :class:`~hf_dpmerge.records.statement.PrivacyStatement` (its composition of ε lives in
:mod:`hf_dpmerge.records.statement`), and :func:`number`, how a card prints a privacy number. What the sentences
say ε covers: docs/design.md §9 and docs/privacy.md.
"""

from __future__ import annotations

import math
from typing import Any

from hf_dpmerge.records.record import REPLACE_ONE


def number(value: float | None) -> str:
    """How a card prints a privacy number: 3 significant digits, ∞ for an infinite ε."""
    if value is None:
        return "not computed"
    return "∞" if math.isinf(value) else f"{value:.3g}"


def phase_sentence(phase: Any) -> str:
    """A :class:`~hf_dpmerge.records.statement.PhasePrivacy`'s numbers as the derivation states them."""
    return (f"`{phase.name}`: {phase.steps} steps with σ = {phase.sigma:.4g} and q = {phase.sample_rate:.4g} "
            f"(expected batch {phase.expected_batch_size})")


class StatementProse:
    """The sentences of a :class:`~hf_dpmerge.records.statement.PrivacyStatement`, mixed into it: they read its
    fields (``epsilon``, ``delta``, ``inputs``, ``selection``, …) and never compute a privacy number."""

    def guarantee(self) -> str:
        """The final guarantee, once, with ε under each neighbouring relation."""
        if self.missing:
            return (f"No privacy record was found for {', '.join(f'`{m}`' for m in self.missing)}: the merged "
                    "model carries **no** differential-privacy guarantee.")
        if not self.private:
            plain = ", ".join(f"`{item.name}`" for item in self.inputs if not item.dp)
            return (f"{plain} {'was' if len(self.inputs) == 1 else 'were'} trained **without differential "
                    "privacy**: the release carries **no** differential-privacy guarantee.")
        text = (f"**Guarantee: (ε = {number(self.epsilon)}, δ = {number(self.delta)})-DP** per privacy unit, "
                f"{self.unit}: ε = {number(self.epsilon)} for {self.relation} (one unit's data present or absent)")
        if self.selection is not None:  # the selection's ε_sel is not accounted under replace-one separately
            return text + f" at δ = {number(self.delta)}; ε for {REPLACE_ONE} is not computed for this total."
        return text + (f", ε = {number(self.epsilon_replace_one)} for {REPLACE_ONE} (one unit's data swapped for "
                       f"other data; PLD accountant), both at δ = {number(self.delta)}.")

    def derivation(self) -> str:
        """How the final guarantee arose from the inputs (and, for a tuned merge, from the selection)."""
        if not self.private:
            return ""
        if self.client_level is not None or self.steps_accounted is not None:
            return self._federated()
        if self.composition == "single":
            item = self.inputs[0]
            units = f"on {item.num_units} units ({item.num_samples} training rows)."
            if len(item.phases) == 1:
                phase = item.phases[0]
                return (f"Accounted by the {item.accountant} accountant over {phase.steps} DP-SGD steps with effective "
                        f"noise multiplier σ = {phase.sigma:.4g} and sampling rate q = {phase.sample_rate:.4g} {units}")
            return (f"Accounted by the {item.accountant} accountant over {sum(p.steps for p in item.phases)} DP-SGD "
                    f"steps in {len(item.phases)} phases on the same data, composed in order (σ the effective noise "
                    f"multiplier, q the sampling rate): {'; then '.join(map(phase_sentence, item.phases))}; {units}")
        parallel = (
            "trained with DP-SGD on its own dataset (tables above). If the datasets are disjoint "
            "(each individual's data lies in one of them), releasing all inputs composes in parallel: "
            "ε = max_t ε_t, δ = max_t δ_t"
        )
        several = "If one unit contributes to several datasets, the ε of those datasets add up for that unit."
        if self.selection is None and not self.merged:
            return (f"Each input was {parallel}: this is the guarantee of the whole release, every adapter in it; "
                    f"one task's adapter alone has its own row's (ε, δ) above. {several}")
        if self.selection is None:
            return (f"Each input was {parallel}; merging released weights is post-processing, so this is the "
                    f"merged model's guarantee. {several}")
        sel = self.selection
        settings = ", ".join(f"`{k}` = {v}" for k, v in sel.chosen.items())
        public = set(sel.validation_size.values())
        sizes = (f"n = {public.pop()} per task" if len(public) == 1 else
                 "n = " + ", ".join(f"{task}: {n}" for task, n in sel.validation_size.items()))
        if sel.composition == "sequential":
            rule = ("sequential composition (the validation data may belong to the training individuals): "
                    f"ε = {number(self.adapters_epsilon)} + {number(sel.epsilon)}")
        else:
            rule = ("parallel composition (the validation individuals were declared disjoint from the training "
                    f"individuals): ε = max({number(self.adapters_epsilon)}, {number(sel.epsilon)})")
        how = (f"among {sel.num_candidates} candidates" if sel.generations == 1 else
               f"once in each of {sel.generations} generations of a CMA-ES search ({sel.num_candidates} proposals in "
               f"all, ε_sel/{sel.generations} per choice, composed)")
        user_level = any(item.unit_column is not None for item in self.inputs)
        return (
            f"The guarantee has two components. The adapters: each input was {parallel}, giving ε = "
            f"{number(self.adapters_epsilon)}, δ = {number(self.adapters_delta)}"
            + (f" per privacy unit ({self.unit})" if user_level else "") + ". The selection: the merge "
            f"hyper-parameters were chosen on private validation data by the {sel.mechanism} mechanism {how} "
            f"({settings} was chosen) at ε_sel = {number(sel.epsilon)} (pure "
            f"ε-DP, δ = 0; utility: {sel.utility}, sensitivity Δ = {sel.sensitivity:.3g} per {sel.relation} of one "
            f"{sel.unit}; public validation size {sizes}, each task's set subsampled to it). They compose by "
            f"{rule} = {number(self.epsilon)}, "
            f"δ = {number(self.delta)}: the guarantee above."
        )

    def _federated(self) -> str:
        text = ("Trained by federated learning: each client trained on its own data with DPSAMTrainer and the "
                "server aggregated their updates (post-processing). The guarantee above is the example-level "
                f"one, steps accounted: {self.steps_accounted}.")
        client = self.client_level
        if client is None:
            return text + " Client level (a client's whole data): no guarantee (the server added no noise)."
        replace = client.get("epsilon_replace_one")
        text += (
            f" Client level (privacy unit: one client's whole data): ε = {number(client['epsilon'])} at "
            f"δ = {number(client['delta'])} over {client['rounds']} rounds for adding or removing one client"
            + (f", ε = {number(replace)} for replacing one client's data (PLD accountant)" if replace is not None
               else "")
            + f"; each client update clipped to {client['clip_norm']:g} and Gaussian noise of multiplier "
            f"{client['noise_multiplier']:g} added to their sum, clients sampled with probability "
            f"{client['sample_rate']:g}."
        )
        if client.get("allow_large_delta"):
            text += (f" **Large client-level δ:** δ = {number(client['delta'])} ≥ 1/K was allowed by name "
                     "(`--allow_large_client_delta`): a guarantee that may fail for one client in K.")
        return text

    def table(self) -> str:
        """Two markdown tables: one row per input (its own ε under each relation, δ, accountant, data), then one
        row per phase its accountant composed (steps, σ_eff, q, expected batch), enough to recompute its ε."""
        lines = [
            "| input | ε (add/remove-one) | ε (replace-one) | δ | accountant | N rows | privacy unit | N units | "
            "SAM mode |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for item in self.inputs:
            unit = "example" if item.unit_column is None else f"unit:{item.unit_column}"
            lines.append(
                f"| {item.name} | {number(item.epsilon)} | {number(item.epsilon_replace_one)} | "
                f"{number(item.delta) if item.dp else '–'} | {item.accountant if item.dp else '–'} | "
                f"{item.num_samples} | {unit} | {item.num_units} | {item.sam_mode} |"
            )
        phases = [(item.name, phase) for item in self.inputs for phase in item.phases]
        if not phases:
            return "\n".join(lines)
        lines += ["", "The DP-SGD phases each input's accountant composed, in order (its ε is over all of them):", "",
                  "| input | phase | steps | σ (effective) | q | expected batch |", "|---|---|---|---|---|---|"]
        lines += [f"| {name} | {p.name} | {p.steps} | {p.sigma:.4g} | {p.sample_rate:.4g} | {p.expected_batch_size} |"
                  for name, p in phases]
        return "\n".join(lines)

    def scope(self) -> str:
        """What ε covers: per which unit, under which relation, and what it does not protect."""
        if not self.private:
            return ""
        text = (f"**What ε covers.** The privacy unit is {self.unit}. ε ({self.relation}) bounds what the release "
                "reveals about whether one unit's data was in the training set")
        text += "." if self.selection is not None else (
            f"; ε ({REPLACE_ONE}) bounds what it reveals when one unit's data is swapped for other data.")
        if any(item.unit_column is None for item in self.inputs):
            text += (" Where the unit is one row, a person, author or other entity with several rows is protected "
                     "only by group privacy (for k rows, roughly k·ε at k·e^{(k−1)ε}·δ), which is weak: train "
                     "with `privacy_unit_column` set to their id for a per-entity guarantee.")
        return text + " " + self.split_scope()

    @staticmethod
    def split_scope() -> str:
        """Which dataset ε is about: the training set as split, not the raw data it was split from."""
        return ("The neighbouring datasets are training sets **as split**: hf_dpmerge's tasks (`load_task`) cut the "
                "validation split, and the test split where the source has none, from the raw training rows by a "
                "seeded permutation, and `max_train_samples` subsamples what is left with the same seed, so adding "
                "or removing one raw row can move many other rows into or out of the training set. ε bounds what "
                "the release reveals about one unit of the training set it was trained on, not about one row of the "
                "raw data it was split from.")

    def notes(self) -> list[str]:
        """Warnings that qualify the guarantee: seeded noise (training or selection), evaluation on data declared
        public."""
        notes = []
        if seeded := self.seeded:
            names = ", ".join(f"`{n}`" for n in seeded)
            notes.append(
                f"**Seeded training: {names}.** Trained with a fixed `dp_seed` (or recorded before the `seeded` "
                "field, so possibly): anyone holding the seed can regenerate the sampling masks and the noise "
                "and undo it, so for these inputs the guarantee holds only against someone who does not know "
                "the seed.")
        if self.selection is not None and self.selection.seeded is not False:
            notes.append(
                "**Seeded selection.** The merge selection drew its validation subsamples and its mechanism's noise "
                "(and an evolutionary search its proposals) from a fixed `--seed` (or its `dp_selection.json` "
                "predates the `seeded` field, so possibly): anyone holding the seed can recompute them and read "
                "from the choice which candidate scored best, so ε_sel, and the total, hold only against someone "
                "who does not know the seed.")
        if public := [item.name for item in self.inputs if item.eval_data_is_public]:
            notes.append(
                f"**Evaluation data declared public: {', '.join(f'`{n}`' for n in public)}.** Evaluated (and "
                "possibly selected: best checkpoint, early stopping) during training on data their trainer "
                "declared public (`eval_data_is_public`); the guarantee does not cover that data.")
        if private_labels := [item.name for item in self.inputs if item.labels_from_private_data]:
            notes.append(
                f"**Label names read off the private rows: {', '.join(f'`{n}`' for n in private_labels)}.** Their "
                "label sets (the heads' `id2label`, a causal LM's record) were taken from the training rows "
                "(`--label_names_from_private_data`), not from public information: the guarantee does not cover "
                "them, and a label only one person's rows carry tells that they were in the data.")
        for item in self.inputs:
            if item.carved_splits:
                missing = " or ".join(item.carved_splits)
                notes.append(f"**Held-out splits of `{item.name}`.** Its dataset had no {missing} split: they were "
                             "held out of the training rows by a seeded stratified split, and the adapter never "
                             "trained on them.")
        return notes

    @staticmethod
    def not_covered() -> str:
        return (
            "**Not covered by the guarantee.** It covers the released weights only. Anything else computed on "
            "private data — evaluation numbers, training diagnostics (losses, gradient norms, alignment or merge "
            "diagnostics), a hyper-parameter selection not accounted above — releases information outside "
            "(ε, δ): publish it only for public data, or account for it separately."
        )

    @staticmethod
    def held_out_evaluation(split: str, metadata: bool = False) -> str:
        """What a card's evaluation table (and, with ``metadata``, its ``model-index``) publishes outside (ε, δ):
        the sentence printed under the table."""
        what = "The table above and the card metadata's `model-index` are" if metadata else "The table above is"
        return (
            f"**Outside the guarantee.** {what} computed on each task's held-out {split} split without noise. ε does "
            f"not cover these numbers: they reveal the size of each task's {split} split (examples) and the models' "
            "scores on it. If that split is private, publish the card without them (push without `--eval_json`)."
        )

    def markdown(self) -> str:
        """The privacy section's body: the inputs' table, the guarantee, its derivation, scope and notes."""
        parts = [self.table(), self.guarantee(), self.derivation(), self.scope(), *self.notes(), self.not_covered()]
        return "\n\n".join(part for part in parts if part) + "\n"
