"""Which trainer and merge method, from measured interference and noise and the benchmarks' stored results.

Measured on the adapters (post-processing, no privacy cost): the cosine and sign-conflict rate of every pair of
task vectors (:mod:`hf_dpmerge.merging.planning.task_similarity`), each task vector's noise-to-signal ratio
√(Σᵢⱼ Var(ΔWᵢⱼ)) / ‖τ‖_F from its record (:mod:`hf_dpmerge.noise.variance`, docs/design.md §6), and the
trainer and ε each record names. :data:`RULES` map them to advice, citing only figures read from
``data/benchmark_evidence.json`` (:data:`EVIDENCE`), ``data/recipe_floor_gap.json`` (:data:`RECIPE_FLOOR_GAP`) and
``data/dp_merging_*.json`` (:data:`TRAINER_EVIDENCE`):
the merge measured at the nearest ε and an interference at least the adapters', the head-only comparison first
where the floor won there or in the LP-FT benchmark. A measurement within :data:`TOLERANCE` of a threshold does
not cross it; outside the measured range a rule says so instead of extrapolating.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

from hf_dpmerge.merging.planning.task_similarity import SimilarityReport, TaskVector
from hf_dpmerge.noise.variance import lora_noise_variance, record_noise_variance

EVIDENCE: dict[str, Any] = json.loads(
    resources.files("hf_dpmerge.merging").joinpath("data", "benchmark_evidence.json").read_text(encoding="utf-8"))
TOLERANCE = 0.01
"""Relative tolerance of every threshold: cosines and sign-conflict rates are sample statistics of finite
vectors (a sign-conflict rate of unrelated vectors scatters around 0.5)."""
BENCHMARK_MAX_ABS_COSINE = EVIDENCE["interference"]["private"]["max_abs_cosine"]
"""Largest |cos| between the private adapters the benchmark ranked merges at (the evidence file says which)."""
NON_PRIVATE_BENCHMARK_MAX_ABS_COSINE = EVIDENCE["interference"]["non_private"]["max_abs_cosine"]
"""Largest |cos| between the non-private adapters the stress benchmark ranked merges at."""
BENCHMARK_MAX_SIGN_CONFLICT = EVIDENCE["interference"]["private"]["max_sign_conflict"]
"""Largest sign-conflict rate between the same adapters: unrelated vectors' ≈ 0.5."""
RECIPE_FLOOR_GAP: dict[str, Any] = json.loads(
    resources.files("hf_dpmerge.merging").joinpath("data", "recipe_floor_gap.json").read_text(encoding="utf-8"))
"""The measured gap between the default recipe's DP adapters and a private head on the frozen encoder, per measured
ε (exported by ``benchmarks/studies/lpft.py`` with LPFT.md; a test keeps it equal to the stored units)."""
TRAINER_EVIDENCE: list[dict[str, Any]] = [
    json.loads(resources.files("hf_dpmerge.merging").joinpath("data", name).read_text(encoding="utf-8"))
    for name in ("dp_merging_lpft.json", "dp_merging_causal.json")]
"""DP-Merging − DP-SGD adapters, merged, per testbed and ε (exported by ``benchmarks/studies/lpft_merge.py`` and
``causal_merge.py`` with their reports; tests keep them equal to the stored units)."""
MEASURED_EPSILONS = sorted({e for e in [*EVIDENCE["quality"]["epsilons"],
                                        *(row["epsilon"] for row in EVIDENCE["settings"])] if e is not None})
NOISE_TO_SIGNAL_FLOOR = 0.05
"""Below this predicted noise-to-signal ratio dp_aware's SURE threshold is ≈ 0 and it reduces to task arithmetic."""
ANTI_ALIGNED_COSINE = -0.1
"""A pair with cos below this pulls against each other: a sum cancels part of both task vectors."""


def above(value: float, limit: float) -> bool:
    """``value`` exceeds ``limit`` by more than :data:`TOLERANCE` of it."""
    return value > limit + TOLERANCE * abs(limit)


def below(value: float, limit: float) -> bool:
    """``value`` falls short of ``limit`` by more than :data:`TOLERANCE` of it."""
    return value < limit - TOLERANCE * abs(limit)


@dataclass(frozen=True)
class Measurements:
    """What the rules read: interference over pairs, noise and training settings over adapters."""

    names: list[str]
    max_abs_cosine: float
    min_cosine: float
    mean_sign_conflict: float
    max_sign_conflict: float
    private: list[bool | None]  # None: no privacy record
    trainers: list[str]  # "non_private" | "dp_sgd" | "dp_merging" | "unknown"
    epsilons: list[float]
    noise_to_signal: list[float | None]  # None: no record, or no noise model for its optimizer

    @property
    def any_private(self) -> bool:
        return any(self.private)

    @property
    def all_non_private(self) -> bool:
        """Every adapter's record says non-private (none missing)."""
        return all(trainer == "non_private" for trainer in self.trainers)

    @property
    def max_noise_to_signal(self) -> float:
        known = [value for value in self.noise_to_signal if value is not None]
        return max(known) if known else math.nan

    @property
    def max_epsilon(self) -> float:
        return max((e for e, p in zip(self.epsilons, self.private, strict=True) if p), default=math.inf)


def trainer_kind(vector: TaskVector) -> str:
    """``non_private``, ``dp_sgd`` (no SAM, no alignment penalty), ``dp_merging`` or ``unknown`` (no record)."""
    record = vector.record
    if record is None:
        return "unknown"
    if not record.dp:
        return "non_private"
    return "dp_merging" if record.sam_mode != "none" or record.align_lambda > 0 else "dp_sgd"


def noise_to_signal(vector: TaskVector, norm: float) -> float | None:
    """√(Σ Var(ΔWᵢⱼ)) / ‖τ‖_F from the record's noise model; 0 when not private, None when unknown."""
    if vector.record is None:
        return None
    try:
        factor_variance = record_noise_variance(vector.record)
    except ValueError:  # an optimizer without a noise model
        return None
    total = sum(
        float(lora_noise_variance(f.lora_a, f.lora_b, f.scaling, factor_variance, factor_variance).double().sum())
        for f in vector.factors.values()
    )
    return math.sqrt(total) / norm


def measure(vectors: Sequence[TaskVector], report: SimilarityReport) -> Measurements:
    """The rules' inputs for ``vectors`` and their similarity ``report`` (same order)."""
    cosine, conflict = report.off_diagonal(report.cosine), report.off_diagonal(report.sign_conflict)
    conflict = conflict[~np.isnan(conflict)]
    return Measurements(
        names=list(report.names),
        max_abs_cosine=float(np.abs(cosine).max()),
        min_cosine=float(cosine.min()),
        mean_sign_conflict=float(conflict.mean()) if conflict.size else math.nan,
        max_sign_conflict=float(conflict.max()) if conflict.size else math.nan,
        private=[None if v.record is None else bool(v.record.dp) for v in vectors],
        trainers=[trainer_kind(v) for v in vectors],
        epsilons=[v.record.epsilon if v.record and v.record.dp else math.inf for v in vectors],
        noise_to_signal=[noise_to_signal(v, norm) for v, norm in zip(vectors, report.norms, strict=True)],
    )


@dataclass(frozen=True)
class Rule:
    """One row of the table: when ``applies``, advise ``advice`` ``because`` (formatted with the measurements)."""

    topic: str  # "first" | "release" | "trainer" | "merge": the first rule that applies wins; "caution": every one
    name: str
    applies: Callable[[Measurements], bool]
    advice: str | Callable[[Measurements], str]
    because: Callable[[Measurements], str]


def measured_max_abs_cosine(m: Measurements) -> float:
    """The largest |cos| the benchmark ranked merges at for adapters like ``m``'s: the stress benchmark's
    interference configuration when every record says non-private, the packaged private adapters otherwise."""
    return NON_PRIVATE_BENCHMARK_MAX_ABS_COSINE if m.all_non_private else BENCHMARK_MAX_ABS_COSINE


def nearest_settings(m: Measurements) -> list[dict[str, Any]]:
    """The stored settings at ``m``'s privacy level: non-private rows when every record says non-private, else
    the rows at the measured ε nearest (on a log scale) to the adapters' largest ε."""
    rows = [row for row in EVIDENCE["settings"] if row["noise_std"] is None]
    if m.all_non_private:
        return [row for row in rows if row["epsilon"] is None]
    private = [row for row in rows if row["epsilon"] is not None]
    if not private or math.isinf(m.max_epsilon):
        return []
    nearest = min(private, key=lambda row: abs(math.log(row["epsilon"] / m.max_epsilon)))["epsilon"]
    return [row for row in private if row["epsilon"] == nearest]


def measured_merge(m: Measurements) -> dict[str, Any] | None:
    """The stored merge choice at ``m``'s privacy level measured at an interference at least ``m``'s (the
    least such), or None."""
    covering = [row for row in nearest_settings(m) if row["choice"] == "merge" and row["max_abs_cosine"] is not None
                and not above(m.max_abs_cosine, row["max_abs_cosine"])]
    return min(covering, key=lambda row: row["max_abs_cosine"]) if covering else None


def floor_won(m: Measurements) -> list[dict[str, Any]]:
    """The stored settings at ``m``'s ε where the floor beat every merge (every one there, else none)."""
    rows = nearest_settings(m) if m.any_private else []
    return rows if rows and all(row["choice"] == "floor" for row in rows) else []


def recipe_floor_gap(m: Measurements) -> dict[str, Any] | None:
    """The floor-gap row at the measured ε nearest (log scale) to ``m``'s largest private ε, or None."""
    rows = RECIPE_FLOOR_GAP["rows"]
    if not m.any_private or math.isinf(m.max_epsilon) or not rows:
        return None
    return min(rows, key=lambda row: abs(math.log(row["epsilon"] / m.max_epsilon)))


def floor_not_beaten(m: Measurements) -> bool:
    """The head-only check applies: the stress benchmark's floor beat every merge at ``m``'s ε, or the private head
    was at least as accurate as the default recipe's DP adapters there (:func:`recipe_floor_gap`)."""
    row = recipe_floor_gap(m)
    return bool(floor_won(m)) or (row is not None and row["difference"] <= 0)


def _point(point: dict[str, Any] | None) -> str:
    return ", ".join(f"{key} {value:g}" if isinstance(value, float) else f"{key} {value}"
                     for key, value in (point or {}).items())


def _verdict(row: dict[str, Any]) -> str:
    return f"{row['difference']:+.1f} points, {'significant' if row['significant'] else 'n.s.'} ({row['test']})"


def _floor_because(m: Measurements) -> str:
    reasons = []
    if (gap := recipe_floor_gap(m)) is not None:
        test = (f"two-sided paired t over {len(gap['seeds'])} seeds p = {gap['p']:.2g}" if gap["p"] is not None
                else f"{len(gap['seeds'])} seed")
        reasons.append(f"{RECIPE_FLOOR_GAP['report']}, ε = {gap['epsilon']:g}, {RECIPE_FLOOR_GAP['split']} accuracy "
                       f"over {', '.join(gap['tasks'])}: the default recipe's DP adapters "
                       f"{gap['adapters']:.1f} vs a private head on the frozen encoder {gap['floor']:.1f} "
                       f"({gap['difference']:+.1f} points, {test})")
    reasons += [f"{row['report']} ({row['configuration']}), ε = {row['epsilon']:g}: the base encoder with each "
                f"task's DP head {row['floor']:.1f} vs the best merge ({row['versus']}) {_verdict(row)}"
                for row in floor_won(m)]
    return "; ".join(reasons)


def _merge_because(m: Measurements) -> str:
    row = measured_merge(m)
    return (f"no DP noise, max |cos| {m.max_abs_cosine:.3f} ≤ {row['max_abs_cosine']:.3f} measured in {row['report']} "
            f"({row['configuration']}): {row['merge']} at {_point(row['point'])} (chosen on validation) was the most "
            f"accurate merge, {row['accuracy']:.1f} vs {row['versus']} {_verdict(row)}; floor {row['floor']:.1f}, "
            f"each task's own adapter {row['individual']:.1f}")


def _release_because(m: Measurements) -> str:
    text = ("the multi-adapter release applies each task's own adapter (LoRA + head) to the shared base: it computes "
            "hf-dpmerge evaluate's individual column, lossless by construction, at the cost of one adapter per task "
            "(a forward per task, or peft's mixed batches across tasks with as many labels); a merge is one set of "
            "weights and keeps part of each adapter's gain over the floor (evaluate's gain retained)")
    row = measured_merge(m)
    if row is not None and row["individual"] is not None:
        text += (f"; in {row['report']} ({row['configuration']}) the most accurate merge reached "
                 f"{row['accuracy']:.1f} vs each task's own adapter {row['individual']:.1f}")
    return text


QUALITY = EVIDENCE["quality"]


def _names(m: Measurements, trainer: str) -> str:
    return ", ".join(n for n, t in zip(m.names, m.trainers, strict=True) if t == trainer)


def dp_merging_gains() -> list[str]:
    """Each merge that DP-Merging's adapters made significantly more accurate than DP-SGD's (Holm-adjusted p <
    0.05 over the methods of one comparison), as ``"<testbed>, ε = <ε>: <method>"``."""
    return [f"{evidence['testbed']}, ε = {c['epsilon']:g}: {method}" for evidence in TRAINER_EVIDENCE
            for c in evidence["comparisons"] for method, row in c["methods"].items()
            if row["difference"] > 0 and row["holm"] is not None and row["holm"] < 0.05]


def _dp_merging_measured() -> str:
    parts = []
    for evidence in TRAINER_EVIDENCE:
        for c in evidence["comparisons"]:
            methods = ", ".join(f"{method} {row['difference']:+.2f}"
                                + ("" if row["holm"] is None else f" (Holm p {row['holm']:.2g})")
                                for method, row in c["methods"].items())
            parts.append(f"{evidence['testbed']}, ε = {c['epsilon']:g}, seeds {', '.join(map(str, c['seeds']))} "
                         f"({c['report']}): DP-Merging − DP-SGD merged {methods}; the adapters alone "
                         f"{c['individual']['dp_merging']:.1f} vs {c['individual']['dp_sgd']:.1f}")
    gains = dp_merging_gains()
    return ("DP-Merging's step (DP-SAT + alignment) made " + ("; ".join(gains) if gains else "no merge")
            + " significantly more accurate in the benchmarks (task-averaged points, paired over seeds): "
            + "; ".join(parts))


def _private_merges() -> str:
    merged = QUALITY["merged_eps4"]
    gap = QUALITY["dp_aware_vs_task_arithmetic_max_gap"]
    return (f"in {QUALITY['report']} dp_aware and task_arithmetic are within {gap} points in every private cell "
            f"(ε = 4: {merged['dp_sgd']['dp_aware'][0]} vs "
            f"{merged['dp_sgd']['task_arithmetic'][0]} DP-SGD, {merged['dp_merging']['dp_aware'][0]} vs "
            f"{merged['dp_merging']['task_arithmetic'][0]} DP-Merging)")


RULES: tuple[Rule, ...] = (
    Rule("first", "compare_with_head_only_first",
         floor_not_beaten,
         "first compare each private adapter with a head-only release (train_glue.py --train_lora false) on public "
         "validation data: at this ε the benchmarks' private head was not beaten; both trained on the same private "
         "data compose their ε",
         lambda m: f"adapters' ε up to {m.max_epsilon:g}; {_floor_because(m)}"),
    Rule("release", "ship_multi_adapter_when_the_task_is_known",
         lambda m: True,
         "when every input's task is known at inference, ship the multi-adapter release instead of a merge "
         "(hf-dpmerge push --multi_adapter: the base once and each task's adapter, lossless); merge (advice below) "
         "when you need one set of weights, the task is unknown at inference, or the model is generative (one LM "
         "answering any prompt)",
         _release_because),
    Rule("trainer", "keep_dp_sgd",
         lambda m: "dp_sgd" in m.trainers and "dp_merging" not in m.trainers,
         "keep the DP-SGD trainer (the training default: --sam_mode none --align_lambda 0)",
         lambda m: f"{_names(m, 'dp_sgd')} trained with DP-SGD; {_dp_merging_measured()}"),
    Rule("trainer", "train_next_with_dp_sgd",
         lambda m: "dp_merging" in m.trainers,
         "train the next adapters with DP-SGD (the default: --sam_mode none --align_lambda 0); retraining on the same "
         "data composes its ε with the released one",
         lambda m: f"{_names(m, 'dp_merging')} trained with DP-SAT/alignment; {_dp_merging_measured()}"),
    Rule("trainer", "non_private",
         lambda m: m.all_non_private,
         "no DP trainer advice: the adapters are not private",
         lambda m: "no adapter's record says dp"),
    Rule("merge", "noisy_private_dp_aware",
         lambda m: m.any_private and "unknown" not in m.trainers
         and not below(m.max_noise_to_signal, NOISE_TO_SIGNAL_FLOOR),
         "merge with dp_aware (merge_configs/dp.yaml; task_arithmetic is as accurate)",
         lambda m: f"predicted noise-to-signal up to {m.max_noise_to_signal:.2f} (≥ {NOISE_TO_SIGNAL_FLOOR}): the "
                   f"task vectors carry DP noise dp_aware can shrink; {_private_merges()}, and dp_aware has the "
                   f"smallest merge gap ({QUALITY['merge_gap']['dp_aware'][0]}–{QUALITY['merge_gap']['dp_aware'][1]} "
                   f"vs {QUALITY['merge_gap']['others'][0]}–{QUALITY['merge_gap']['others'][1]})"),
    Rule("merge", "quiet_private_task_arithmetic",
         lambda m: m.any_private or "unknown" in m.trainers,
         "merge with task_arithmetic (merge_configs/task_arithmetic.yaml)",
         lambda m: f"predicted noise-to-signal {m.max_noise_to_signal:.2f} < {NOISE_TO_SIGNAL_FLOOR} (or unknown): "
                   f"dp_aware would reduce to task arithmetic (and needs every record); {_private_merges()}"),
    Rule("merge", "measured_non_private_merge",
         lambda m: measured_merge(m) is not None,
         lambda m: (f"merge with {measured_merge(m)['merge']} at {_point(measured_merge(m)['point'])} "
                    f"(merge_configs/{measured_merge(m)['merge']}.yaml with those parameters)"),
         _merge_because),
    Rule("merge", "unmeasured_task_arithmetic",
         lambda m: True,
         "merge with task_arithmetic and validate it yourself (merge_configs/task_arithmetic.yaml)",
         lambda m: f"max |cos| {m.max_abs_cosine:.3f} is beyond every non-private ranking the benchmark stored "
                   f"(up to {NON_PRIVATE_BENCHMARK_MAX_ABS_COSINE:.3f}): task arithmetic is the plain sum"),
    Rule("caution", "unknown_records",
         lambda m: "unknown" in m.trainers,
         "release the adapters with their dp_privacy.json (train with DPSAMTrainer)",
         lambda m: f"{_names(m, 'unknown')} carry no privacy record: trainer and noise are unknown"),
    Rule("caution", "avoid_cauchy_poe_on_private",
         lambda m: m.any_private,
         "avoid cauchy_poe at λ = 1 on these adapters",
         lambda m: "private adapters: in " + QUALITY["report"] + " cauchy_poe at merge_configs' λ = 1 was "
                   + " and ".join(f"{v} points below the better of task_arithmetic/ties on {k} adapters"
                                  for k, v in QUALITY["cauchy_poe_lambda1_below_best"].items()) + " (ε = 4)"),
    Rule("caution", "avoid_ties_on_dp_sgd",
         lambda m: "dp_sgd" in m.trainers,
         "avoid ties on DP-SGD adapters",
         lambda m: f"in {QUALITY['report']} ties was below task_arithmetic on DP-SGD adapters by "
                   + ", ".join(f"{v} points at ε = {k}"
                               for k, v in QUALITY["ties_below_task_arithmetic_dp_sgd"].items())),
    Rule("caution", "epsilon_outside_benchmark",
         lambda m: any(p and below(e, MEASURED_EPSILONS[0]) for p, e in zip(m.private, m.epsilons, strict=True)),
         "validate the merge yourself: ε below the benchmarked range",
         lambda m: f"smallest ε {min(m.epsilons):.3g} < {MEASURED_EPSILONS[0]:g}; the benchmarks measured "
                   f"ε ∈ {{{', '.join(f'{e:g}' for e in MEASURED_EPSILONS)}}} only"),
    Rule("caution", "interference_outside_benchmark",
         lambda m: above(m.max_abs_cosine, measured_max_abs_cosine(m))
         or above(m.max_sign_conflict, BENCHMARK_MAX_SIGN_CONFLICT),
         "group first (hf-dpmerge similarity) and validate each group's merge",
         lambda m: f"max |cos| {m.max_abs_cosine:.3f} / max sign conflict {m.max_sign_conflict:.3f} exceed the "
                   f"benchmarked adapters' {measured_max_abs_cosine(m):.3f} / {BENCHMARK_MAX_SIGN_CONFLICT:.3f} "
                   f"(beyond a {TOLERANCE:.0%} tolerance), the interference the benchmark ranked the methods at: "
                   "no measured evidence ranks them here"),
    Rule("caution", "anti_aligned_pair",
         lambda m: below(m.min_cosine, ANTI_ALIGNED_COSINE),
         "do not merge the anti-aligned pair into one model",
         lambda m: f"min cos {m.min_cosine:.3f} < {ANTI_ALIGNED_COSINE}: a weighted sum cancels part of both task "
                   "vectors (arithmetic, not a benchmark result)"),
)


@dataclass(frozen=True)
class Recommendation:
    rule: str
    topic: str
    advice: str
    because: str


def recommend(measurements: Measurements, rules: Sequence[Rule] = RULES) -> list[Recommendation]:
    """The first rule that applies of each topic ("first": what to check before anything, then "release": ship
    the adapters or merge them, "trainer", "merge"), then every caution that applies."""
    chosen, decided = [], set()
    for rule in rules:
        if (rule.topic in decided and rule.topic != "caution") or not rule.applies(measurements):
            continue
        decided.add(rule.topic)
        advice = rule.advice(measurements) if callable(rule.advice) else rule.advice
        chosen.append(Recommendation(rule.name, rule.topic, advice, rule.because(measurements)))
    return chosen
