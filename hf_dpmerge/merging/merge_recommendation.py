"""Which trainer and merge method, from measured interference and noise, per the project's benchmark.

Measured on the adapters (post-processing of released weights and records, no privacy cost):

- interference: cosine similarity and sign-conflict rate of every pair of task vectors
  (:mod:`hf_dpmerge.merging.task_similarity`);
- noise: the noise-to-signal ratio of each task vector, √(Σᵢⱼ Var(ΔWᵢⱼ)) / ‖τ‖_F, with the per-coordinate
  DP-SGD noise variance its privacy record predicts (:mod:`hf_dpmerge.merging.noise_variance`, docs/design.md
  §6; an upper bound where curvature damps the walk);
- the trainer each record names: non-private, DP-SGD (no SAM, λ = 0) or DP-Merging (DP-SAT and/or λ > 0).

:data:`RULES` maps those measurements to advice. Every rule cites the measurement that triggers it and the
benchmark figure behind it: BENCHMARKS.md (``python benchmarks/quality.py --grid cpu --seeds 3``, four
packaged tasks, MiniLM + LoRA r = 8, ε ∈ {4, 8}) and, for the interference range, the packaged adapters
measured in the README section "Task grouping"; the head-only caution cites BENCHMARKS_STRESS.md
(``python -m benchmarks.quality --grid stress``, six packaged tasks, LoRA r = 16 on every module, ε ∈ {1, 4, 8});
the non-private merge rule cites it and its interference configuration
(``benchmarks/reports/stress-interference/BENCHMARKS_STRESS.md``: [CLS] pooling, LoRA r = 64, where merging
costs 3–6 points). Outside the measured range a rule says so instead of extrapolating.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hf_dpmerge.merging.noise_variance import lora_noise_variance, record_noise_variance
from hf_dpmerge.merging.task_similarity import SimilarityReport, TaskVector

BENCHMARK_EPSILONS = (4.0, 8.0)
"""ε values of the benchmark's private cells."""
BENCHMARK_MAX_ABS_COSINE = 0.011
"""Largest |cos| between private packaged-task adapters (rotten_tomatoes, reuters_r8, reuters_r52, bbc_news;
DP-Merging, ε = 8; README "Task grouping": 0.0104, rounded up): the interference under which BENCHMARKS.md
ranked the merge methods, whose LoRA adapters come from the same recipe (independent A initialisations)."""
NON_PRIVATE_BENCHMARK_MAX_ABS_COSINE = 0.081
"""Largest |cos| between the non-private adapters of the stress benchmark's interference configuration
(reuters_r8 vs reuters_r52, which share documents: 0.080, rounded up): the interference under which it ranked the
merge methods on non-private adapters."""
BENCHMARK_MAX_SIGN_CONFLICT = 0.501
"""Largest sign-conflict rate between the same adapters (0.4999, rounded up): unrelated vectors' ≈ 0.5."""
NOISE_TO_SIGNAL_FLOOR = 0.05
"""Below this predicted noise-to-signal ratio dp_aware's SURE threshold is ≈ 0 and it reduces to task arithmetic."""
ANTI_ALIGNED_COSINE = -0.1
"""A pair with cos below this pulls against each other: a sum cancels part of both task vectors."""


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

    topic: str  # "trainer" | "merge": the first rule that applies wins; "caution": every one that applies
    name: str
    applies: Callable[[Measurements], bool]
    advice: str
    because: Callable[[Measurements], str]


def measured_max_abs_cosine(m: Measurements) -> float:
    """The largest |cos| the benchmark ranked merges at for adapters like ``m``'s: the stress benchmark's
    interference configuration when every record says non-private, the packaged private adapters otherwise."""
    return NON_PRIVATE_BENCHMARK_MAX_ABS_COSINE if m.all_non_private else BENCHMARK_MAX_ABS_COSINE


def _names(m: Measurements, trainer: str) -> str:
    return ", ".join(n for n, t in zip(m.names, m.trainers, strict=True) if t == trainer)


RULES: tuple[Rule, ...] = (
    Rule("trainer", "retrain_dp_sgd_with_dp_merging",
         lambda m: "dp_sgd" in m.trainers,
         "retrain the DP-SGD adapters with the DP-Merging trainer (sam_mode dp_sat, align_lambda 0.05)",
         lambda m: f"{_names(m, 'dp_sgd')} trained with DP-SGD (no SAM, λ = 0); in the benchmark (ε = 4, 3 seeds) "
                   "DP-Merging cut sharpness 0.054 → 0.036, top Hessian eigenvalue 15.9 → 10.8, LoRA drift 2.5× and "
                   "the ties merge gap 0.109 → 0.081, at the same ε; merged accuracy +0.6 points with ties, +1.3 with "
                   "cauchy_poe, ±0 with task_arithmetic"),
    Rule("trainer", "keep_dp_merging",
         lambda m: m.any_private and all(t in ("dp_merging", "non_private") for t in m.trainers),
         "keep the DP-Merging trainer",
         lambda m: f"every private adapter ({_names(m, 'dp_merging')}) already trained with DP-SAT/alignment, "
                   "the benchmark's flatter, less drifting setting"),
    Rule("trainer", "non_private",
         lambda m: m.all_non_private,
         "no DP trainer advice: the adapters are not private",
         lambda m: "no adapter's record says dp; DP-Merging's geometry gains are a DP effect in the benchmark"),
    Rule("merge", "noisy_private_dp_aware",
         lambda m: m.any_private and "unknown" not in m.trainers and m.max_noise_to_signal >= NOISE_TO_SIGNAL_FLOOR,
         "merge with dp_aware (merge_configs/dp.yaml; task_arithmetic is as accurate)",
         lambda m: f"predicted noise-to-signal up to {m.max_noise_to_signal:.2f} (≥ {NOISE_TO_SIGNAL_FLOOR}): the "
                   "task vectors carry DP noise dp_aware can shrink; in the benchmark dp_aware and task_arithmetic "
                   "are within 0.4 points in every private cell (ε = 4: 84.3 vs 84.4 DP-SGD, 84.2 vs 84.4 "
                   "DP-Merging) and dp_aware has the smallest merge gap (0.019–0.036 vs 0.059–0.084)"),
    Rule("merge", "quiet_private_task_arithmetic",
         lambda m: m.any_private or "unknown" in m.trainers,
         "merge with task_arithmetic (merge_configs/task_arithmetic.yaml)",
         lambda m: f"predicted noise-to-signal {m.max_noise_to_signal:.2f} < {NOISE_TO_SIGNAL_FLOOR} (or unknown): "
                   "dp_aware would reduce to task arithmetic (and needs every record); task_arithmetic was within "
                   "0.4 points of the best method in every private benchmark cell (ε = 4: 84.4 ± 0.4 DP-SGD, "
                   "84.4 ± 0.3 DP-Merging)"),
    Rule("merge", "non_private_cauchy_poe",
         lambda m: True,
         "merge with cauchy_poe at lambda 0.5 (merge_configs/cauchy_poe.yaml with lambda: 0.5)",
         lambda m: "no DP noise: on the stress benchmark's six tasks cauchy_poe, at λ = 0.5 in every seed (chosen on "
                   "validation), was the most accurate merge where merging costs accuracy (80.6 ± 0.8 vs the best "
                   "stock merge, ties, 79.7 ± 1.3: +0.9 points, significant; 3 seeds, [CLS] pooling, r = 64) and "
                   "tied where it does not (+0.4, n.s.); on the four-task grid every method was within 0.1 points"),
    Rule("caution", "unknown_records",
         lambda m: "unknown" in m.trainers,
         "release the adapters with their dp_privacy.json (train with DPSAMTrainer)",
         lambda m: f"{_names(m, 'unknown')} carry no privacy record: trainer and noise are unknown"),
    Rule("caution", "compare_with_head_only",
         lambda m: m.any_private,
         "before merging, check that each private adapter beats a head-only release (train_glue.py --train_lora "
         "false) on public validation data; both trained on the same private data compose their ε",
         lambda m: "private adapters: on the stress grid (6 tasks, LoRA r = 16 on every module, 60 steps of 32) the "
                   "base encoder with each task's DP head beat every DP LoRA adapter and every merge of them at "
                   "ε = 1, 4 and 8 (ε = 4: 73.4 vs adapters 69.6 and best merge 67.9, significant)"),
    Rule("caution", "avoid_cauchy_poe_on_private",
         lambda m: m.any_private,
         "avoid cauchy_poe at λ = 1 on these adapters",
         lambda m: "private adapters: cauchy_poe at merge_configs' λ = 1 was 2.0 points below the better of "
                   "task_arithmetic/ties on DP-SGD adapters and 0.8 on DP-Merging adapters (ε = 4, 3 seeds)"),
    Rule("caution", "avoid_ties_on_dp_sgd",
         lambda m: "dp_sgd" in m.trainers,
         "avoid ties on DP-SGD adapters",
         lambda m: "ties was 0.9 points below task_arithmetic on DP-SGD adapters at ε = 4 (83.5 vs 84.4) and "
                   "1.0 at ε = 8"),
    Rule("caution", "epsilon_outside_benchmark",
         lambda m: any(p and e < min(BENCHMARK_EPSILONS) for p, e in zip(m.private, m.epsilons, strict=True)),
         "validate the merge yourself: ε below the benchmarked range",
         lambda m: f"smallest ε {min(m.epsilons):.3g} < {min(BENCHMARK_EPSILONS):g}; the benchmark measured "
                   "ε ∈ {4, 8} only, where noise matters less"),
    Rule("caution", "interference_outside_benchmark",
         lambda m: m.max_abs_cosine > measured_max_abs_cosine(m) or m.max_sign_conflict > BENCHMARK_MAX_SIGN_CONFLICT,
         "group first (hf-dpmerge similarity) and validate each group's merge",
         lambda m: f"max |cos| {m.max_abs_cosine:.3f} / max sign conflict {m.max_sign_conflict:.3f} exceed the "
                   f"benchmarked adapters' {measured_max_abs_cosine(m):.3f} / {BENCHMARK_MAX_SIGN_CONFLICT:.3f}, the "
                   "interference the benchmark ranked the methods at: no measured evidence ranks them here"),
    Rule("caution", "anti_aligned_pair",
         lambda m: m.min_cosine < ANTI_ALIGNED_COSINE,
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
    """The first trainer rule and first merge rule that apply, then every caution that applies."""
    chosen, decided = [], set()
    for rule in rules:
        if (rule.topic in decided and rule.topic != "caution") or not rule.applies(measurements):
            continue
        decided.add(rule.topic)
        chosen.append(Recommendation(rule.name, rule.topic, rule.advice, rule.because(measurements)))
    return chosen
