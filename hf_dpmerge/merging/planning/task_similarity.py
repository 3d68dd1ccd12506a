"""How alike LoRA adapters' task vectors are: cosine similarity and sign-conflict rate, without ΔW.

With τ = s·B·A per layer, inner products need only r×r matrices: ⟨s₁B₁A₁, s₂B₂A₂⟩_F = s₁s₂·tr((B₁ᵀB₂)(A₂A₁ᵀ)),
summed over layers into one cosine over the model. The sign-conflict rate (TIES' interference, arXiv:2306.01708
§3) is the exact share of coordinates where two ΔW have opposite signs, counted in blocks of
:data:`BLOCK_ELEMENTS`. For DP adapters the noise-aware cosine subtracts each one's predicted noise energy
N = Σ Var(ΔW) (docs/design.md §6):

    ĉos(τ_i, τ_j) = ⟨τ̃_i, τ̃_j⟩ / √((‖τ̃_i‖² − N_i)(‖τ̃_j‖² − N_j))   (NaN where ‖τ̃‖² ≤ N)

with a 95 % interval from the sampling spread and the noise model's ±:data:`NOISE_MODEL_RELATIVE_ERROR`. Only LoRA
layers enter (heads are never merged); post-processing, no privacy cost. See docs/merging.md.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hf_dpmerge.lora import LoraFactor
from hf_dpmerge.merging.inputs import (
    adapter_input,
    adapter_weights,
    factor_noise_variance,
    input_lora_noise,
    is_private,
)
from hf_dpmerge.records.record import PrivacyRecord, find_privacy_record
from hf_dpmerge.records.run_folders import ADAPTER_DIR, ENCODER_ADAPTER_DIR, is_peft_adapter

BLOCK_ELEMENTS = 1 << 22
"""Largest block of ΔW entries (rows × d_in) materialised at once for the sign-conflict count."""
NOISE_MODEL_RELATIVE_ERROR = 0.2
"""How far the predicted noise energy may be from the measured one (relative): the noise model against 8
noise-only re-runs, predicted/measured 0.88–1.09 per kind (benchmarks/reports/noise_reruns/NOISE_RERUNS.md,
docs/design.md §6), rounded up to ±20 %."""
ADAPTER_DIRS = (ENCODER_ADAPTER_DIR, ADAPTER_DIR)
"""A run folder's adapters, in order of preference: the LoRA-only export, then the adapter with its head."""


@dataclass(frozen=True)
class TaskVector:
    """One adapter's task vector as its LoRA factors, by base weight name, with its privacy record."""

    name: str
    adapter_dir: Path
    factors: dict[str, LoraFactor]
    record: PrivacyRecord | None


def load_task_vector(path: str | os.PathLike) -> TaskVector:
    """The task vector of a run folder (``<run>/encoder_adapter`` or ``<run>/adapter``) or an adapter folder.

    Its name is the run folder's name (the adapter folder's own name when it is not inside a run folder).
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} does not exist: give a run folder (runs/<task>) or a peft adapter folder")
    adapter_dir = next((path / sub for sub in ADAPTER_DIRS if is_peft_adapter(path / sub)), path)
    if not is_peft_adapter(adapter_dir):
        raise FileNotFoundError(
            f"{path} is neither a run folder (with {' or '.join(ADAPTER_DIRS)}/) nor a peft adapter "
            "(no adapter_config.json)"
        )
    factors = adapter_weights(adapter_dir).factors
    if not factors:
        raise ValueError(f"{adapter_dir} has no LoRA layers: its task vector is empty")
    name = adapter_dir.parent.name if adapter_dir.name in ADAPTER_DIRS else adapter_dir.name
    return TaskVector(name, adapter_dir, factors, find_privacy_record(adapter_dir))


def _check_shapes(layer: str, first: LoraFactor, second: LoraFactor) -> None:
    if first.lora_b.shape[0] != second.lora_b.shape[0] or first.lora_a.shape[1] != second.lora_a.shape[1]:
        raise ValueError(
            f"layer {layer}: ΔW shapes {tuple(first.lora_b.shape[:1]) + tuple(first.lora_a.shape[1:])} and "
            f"{tuple(second.lora_b.shape[:1]) + tuple(second.lora_a.shape[1:])} differ: the adapters were "
            "trained on different base models"
        )


def lora_inner_product(first: LoraFactor, second: LoraFactor) -> float:
    """⟨s₁B₁A₁, s₂B₂A₂⟩_F = s₁s₂·tr((B₁ᵀB₂)(A₂A₁ᵀ)), from r₁×r₂ Gram matrices only."""
    b_gram = first.lora_b.double().T @ second.lora_b.double()  # r₁×r₂
    a_gram = second.lora_a.double() @ first.lora_a.double().T  # r₂×r₁
    return first.scaling * second.scaling * float(torch.trace(b_gram @ a_gram))


def lora_sq_norm(factors: LoraFactor) -> float:
    """‖s·B·A‖²_F = s²·Σᵢⱼ (BᵀB)ᵢⱼ(AAᵀ)ᵢⱼ."""
    b, a = factors.lora_b.double(), factors.lora_a.double()
    return factors.scaling**2 * float(((b.T @ b) * (a @ a.T)).sum())


def lora_sign_conflicts(first: LoraFactor, second: LoraFactor) -> tuple[int, int]:
    """(coordinates where s₁B₁A₁ and s₂B₂A₂ have opposite signs, coordinates compared), exact, in row blocks."""
    d_out, d_in = first.lora_b.shape[0], first.lora_a.shape[1]
    rows = max(1, BLOCK_ELEMENTS // d_in)
    sign = math.copysign(1.0, first.scaling * second.scaling)
    conflicts = 0
    for start in range(0, d_out, rows):
        block_1 = first.lora_b[start:start + rows].double() @ first.lora_a.double()
        block_2 = second.lora_b[start:start + rows].double() @ second.lora_a.double()
        conflicts += int((sign * block_1 * block_2 < 0).sum())
    return conflicts, d_out * d_in


@dataclass
class SimilarityReport:
    """Pairwise statistics of n task vectors: ``cosine`` and ``sign_conflict`` are n×n, ``norms`` ‖τᵢ‖_F."""

    names: list[str]
    adapter_dirs: list[str]
    norms: list[float]
    cosine: np.ndarray
    sign_conflict: np.ndarray
    noise_energy: list[float]  # N_i = E‖τ̃_i − τ_i‖², 0 for an adapter without a DP record
    denoised_cosine: np.ndarray  # ĉos (module docstring); NaN where an adapter is indistinguishable from noise
    denoised_interval: np.ndarray  # n×n×2: its 95 % interval (sampling and the noise model's error), in [−1, 1]

    @property
    def grouping_cosine(self) -> np.ndarray:
        """What adapters group by: the lower end of the noise-aware cosine's interval where it is defined (a pair
        joins only when its whole interval clears the threshold), else the raw cosine (independent noise only
        shrinks the raw cosine toward 0, so it is the conservative estimate where the predicted noise is not
        below an adapter's energy)."""
        return np.where(np.isnan(self.denoised_cosine), self.cosine, self.denoised_interval[..., 0])

    def off_diagonal(self, matrix: np.ndarray) -> np.ndarray:
        """The entries above the diagonal of an n×n statistic (one per pair)."""
        return matrix[np.triu_indices(len(self.names), k=1)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "names": self.names,
            "adapter_dirs": self.adapter_dirs,
            "norms": self.norms,
            "cosine": self.cosine.tolist(),
            "sign_conflict": self.sign_conflict.tolist(),
            "noise_energy": self.noise_energy,
            "denoised_cosine": np.where(np.isnan(self.denoised_cosine), None, self.denoised_cosine).tolist(),
            "denoised_interval": np.where(np.isnan(self.denoised_interval), None, self.denoised_interval).tolist(),
            "noise_model_relative_error": NOISE_MODEL_RELATIVE_ERROR,
            "sign_conflict_method": f"exact, every coordinate of the layers both adapters change, in blocks of "
                                    f"≤ {BLOCK_ELEMENTS} entries",
        }

    def table(self) -> str:
        """Cosine similarity above the diagonal, sign-conflict rate below it."""
        width = max(8, *(len(name) for name in self.names)) + 2
        lines = ["cosine similarity (upper triangle) / sign-conflict rate (lower triangle)",
                 " " * width + "".join(f"{name[:width - 2]:>{width}}" for name in self.names)]
        for i, name in enumerate(self.names):
            cells = []
            for j in range(len(self.names)):
                value = self.cosine[i, j] if i <= j else self.sign_conflict[i, j]
                cells.append(f"{value:>{width}.3f}")
            lines.append(f"{name:<{width}}" + "".join(cells))
        lines.append("‖τ‖_F: " + ", ".join(f"{n} {v:.4g}" for n, v in zip(self.names, self.norms, strict=True)))
        if any(self.noise_energy):
            lines.append("predicted noise share N/‖τ̃‖²: " + ", ".join(
                f"{n} {e / v**2:.3f}" for n, e, v in zip(self.names, self.noise_energy, self.norms, strict=True)))
            lines.append(f"noise-aware cosine [95 % interval, sampling and the noise model's "
                         f"±{NOISE_MODEL_RELATIVE_ERROR:.0%}] (grouping uses the interval's lower end):")
            for i, j in zip(*np.triu_indices(len(self.names), k=1), strict=True):
                low, high = self.denoised_interval[i, j]
                value = self.denoised_cosine[i, j]
                lines.append(f"  {self.names[i]} / {self.names[j]}: " + (
                    "undefined (the predicted noise is not below an adapter's energy: grouped by the raw cosine)"
                    if math.isnan(value)
                    else f"{value:.3f} [{low:.3f}, {high:.3f}]"))
        return "\n".join(lines)


def task_similarity(vectors: Sequence[TaskVector]) -> SimilarityReport:
    """Cosine similarity and sign-conflict rate of every pair of ``vectors`` (at least two)."""
    if len(vectors) < 2:
        raise ValueError(f"need at least two adapters to compare, got {len(vectors)}")
    names = [vector.name for vector in vectors]
    if len(set(names)) != len(names):
        raise ValueError(f"adapters must have distinct run names, got {names}")
    _check_same_base(vectors)
    n = len(vectors)
    layer_sq_norms = [{layer: lora_sq_norm(f) for layer, f in vector.factors.items()} for vector in vectors]
    norms = [math.sqrt(sum(layers.values())) for layers in layer_sq_norms]
    for vector, norm in zip(vectors, norms, strict=True):
        if norm == 0.0:
            raise ValueError(f"{vector.adapter_dir}: the task vector is zero (an untrained adapter?)")
    noise = [layer_noise_energy(vector) for vector in vectors]
    energy = [sum(layers.values()) for layers in noise]
    clean = [norm**2 - e if norm**2 > e else math.nan for norm, e in zip(norms, energy, strict=True)]  # ‖τ‖² est.
    cosine, conflict = np.eye(n), np.zeros((n, n))
    denoised, interval = np.full((n, n), math.nan), np.full((n, n, 2), math.nan)
    factors = (1.0 - NOISE_MODEL_RELATIVE_ERROR, 1.0, 1.0 + NOISE_MODEL_RELATIVE_ERROR)  # the noise model's range
    for i in range(n):
        denoised[i, i] = interval[i, i] = 1.0 if not math.isnan(clean[i]) else math.nan
        for j in range(i + 1, n):
            inner, variances, conflicts, compared = 0.0, [0.0] * len(factors), 0, 0
            for layer in vectors[i].factors.keys() & vectors[j].factors.keys():
                first, second = vectors[i].factors[layer], vectors[j].factors[layer]
                _check_shapes(layer, first, second)
                inner += lora_inner_product(first, second)
                count, total = lora_sign_conflicts(first, second)
                conflicts, compared = conflicts + count, compared + total
                # Var⟨τ̃_i, τ̃_j⟩ ≈ Σ_layers (‖τ_i‖²·v_j + ‖τ_j‖²·v_i + n·v_i·v_j), v = N_layer/n the layer's mean noise
                # variance, at each scale f of the noise model's range
                for k, f in enumerate(factors):
                    noise_i, noise_j = f * noise[i].get(layer, 0.0), f * noise[j].get(layer, 0.0)
                    clean_i, clean_j = layer_sq_norms[i][layer] - noise_i, layer_sq_norms[j][layer] - noise_j
                    variances[k] += (max(clean_i, 0.0) * noise_j + max(clean_j, 0.0) * noise_i
                                     + noise_i * noise_j) / total
            cosine[i, j] = cosine[j, i] = inner / (norms[i] * norms[j])
            conflict[i, j] = conflict[j, i] = conflicts / compared if compared else math.nan
            denoised[i, j] = denoised[j, i] = inner / math.sqrt(clean[i] * clean[j])  # NaN: either noise-dominated
            # ĉos is monotone in f, so the union of the sampling intervals at f = 0.8, 1, 1.2 bounds it; where f·N
            # reaches an adapter's energy the denominator reaches 0 and that side runs to ±1
            if not math.isnan(denoised[i, j]):
                ends = [_divide(inner + sign * 1.96 * math.sqrt(variance),
                                denoising_scale(norms[i], norms[j], energy[i], energy[j], f))
                        for f, variance in zip(factors, variances, strict=True) for sign in (-1.0, 1.0)]
                interval[i, j] = interval[j, i] = np.clip((min(ends), max(ends)), -1.0, 1.0)
    return SimilarityReport(names, [str(v.adapter_dir) for v in vectors], norms, cosine, conflict, energy, denoised,
                            interval)


def denoising_scale(norm_i: float, norm_j: float, noise_i: float, noise_j: float, factor: float) -> float:
    """√((‖τ̃_i‖² − f·N_i)(‖τ̃_j‖² − f·N_j)), ĉos's denominator at noise scaled by ``factor``; 0 where f·N reaches an
    adapter's energy."""
    clean_i, clean_j = norm_i**2 - factor * noise_i, norm_j**2 - factor * noise_j
    return math.sqrt(clean_i * clean_j) if clean_i > 0 and clean_j > 0 else 0.0


def _divide(numerator: float, scale: float) -> float:
    """``numerator / scale``, ±∞ (0 for a zero numerator) at scale 0: the corrected cosine is unbounded there."""
    return numerator / scale if scale > 0 else math.copysign(math.inf, numerator) if numerator else 0.0


def layer_noise_energy(vector: TaskVector) -> dict[str, float]:
    """Per LoRA layer, the expected noise energy Σ Var(ΔW) of ``vector`` predicted from its privacy record (and
    noise statistics); empty for an adapter without a DP record."""
    if not is_private(vector.record):
        return {}
    reference = adapter_input(vector.adapter_dir)
    energy = {}
    for layer in vector.factors:
        noisy = input_lora_noise(reference, layer, {})
        if noisy is not None:
            energy[layer] = float(factor_noise_variance(*noisy).sum())
    return energy


def _check_same_base(vectors: Sequence[TaskVector]) -> None:
    """Refuse adapters whose privacy records name different base-weight fingerprints."""
    hashes = {v.name: v.record.base_model_hash for v in vectors if v.record and v.record.base_model_hash}
    if len(set(hashes.values())) > 1:
        raise ValueError(f"the adapters were trained on different base models (base_model_hash: {hashes}); "
                         "task vectors of different bases cannot be compared")
