"""How alike LoRA adapters' task vectors are: cosine similarity and sign-conflict rate, without ΔW.

An adapter changes each LoRA layer by τ = s·B·A (B: d_out×r, A: r×d_in, s its scaling). The Frobenius
inner product of two such changes needs only r×r matrices (docs/design.md §4, the Gram trick):

    ⟨s₁B₁A₁, s₂B₂A₂⟩_F = s₁s₂·tr(A₁ᵀB₁ᵀB₂A₂) = s₁s₂·tr((B₁ᵀB₂)(A₂A₁ᵀ)),
    ‖s·B·A‖²_F = s²·Σᵢⱼ (BᵀB)ᵢⱼ(AAᵀ)ᵢⱼ,

summed over layers; cos(τ₁, τ₂) = ⟨τ₁, τ₂⟩ / (‖τ₁‖‖τ₂‖) over the whole model (a layer only one adapter
changes adds to its norm, not to the inner product). The **sign-conflict rate** is the fraction of
coordinates, over the layers both adapters change, where the two ΔW have opposite signs (TIES' notion of
interference, arXiv 2306.01708 §3). It needs entries, so it is computed exactly, layer by layer, in
blocks of rows of at most :data:`BLOCK_ELEMENTS` entries (memory stays bounded; no sampling). Two
unrelated dense task vectors conflict on about half of their coordinates; aligned ones on fewer.

Only LoRA layers enter: task heads (peft ``modules_to_save``) differ per task and are never merged.
The statistics are post-processing of released adapters and cost no privacy.
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
from hf_dpmerge.merging.inputs import adapter_weights
from hf_dpmerge.records.record import PrivacyRecord, find_privacy_record
from hf_dpmerge.records.runs_layout import ADAPTER_DIR, ENCODER_ADAPTER_DIR, is_peft_adapter

BLOCK_ELEMENTS = 1 << 22
"""Largest block of ΔW entries (rows × d_in) materialised at once for the sign-conflict count."""
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
    norms = [math.sqrt(sum(lora_sq_norm(f) for f in vector.factors.values())) for vector in vectors]
    for vector, norm in zip(vectors, norms, strict=True):
        if norm == 0.0:
            raise ValueError(f"{vector.adapter_dir}: the task vector is zero (an untrained adapter?)")
    cosine, conflict = np.eye(n), np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            inner, conflicts, compared = 0.0, 0, 0
            for layer in vectors[i].factors.keys() & vectors[j].factors.keys():
                first, second = vectors[i].factors[layer], vectors[j].factors[layer]
                _check_shapes(layer, first, second)
                inner += lora_inner_product(first, second)
                count, total = lora_sign_conflicts(first, second)
                conflicts, compared = conflicts + count, compared + total
            cosine[i, j] = cosine[j, i] = inner / (norms[i] * norms[j])
            conflict[i, j] = conflict[j, i] = conflicts / compared if compared else math.nan
    return SimilarityReport(names, [str(v.adapter_dir) for v in vectors], norms, cosine, conflict)


def _check_same_base(vectors: Sequence[TaskVector]) -> None:
    """Refuse adapters whose privacy records name different base-weight fingerprints."""
    hashes = {v.name: v.record.base_model_hash for v in vectors if v.record and v.record.base_model_hash}
    if len(set(hashes.values())) > 1:
        raise ValueError(f"the adapters were trained on different base models (base_model_hash: {hashes}); "
                         "task vectors of different bases cannot be compared")


def plot_similarity(report: SimilarityReport, path: str | os.PathLike, groups: Sequence[Sequence[str]] = ()) -> Path:
    """Heatmap of the cosine matrix (annotated), names ordered by group; saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    order = [report.names.index(name) for group in groups for name in group] or list(range(len(report.names)))
    matrix = report.cosine[np.ix_(order, order)]
    labels = [report.names[i] for i in order]
    limit = max(1e-6, float(np.abs(matrix - np.eye(len(order))).max()))
    size = 1.2 + 0.9 * len(labels)
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    image = ax.imshow(matrix, cmap="RdBu_r", vmin=-limit, vmax=limit)
    for i in range(len(order)):
        for j in range(len(order)):
            ax.text(j, i, f"{matrix[i, j]:.3f}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_title("cosine similarity of task vectors (colour range: off-diagonal max)", fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.046)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
