"""Loss along the segment from a task's own model to the merged model (DP-Merging Figure 2 and merge gap, §3.2).

    w(γ) = (1 − γ)·w_t + γ·w_merge,  γ ∈ [0, 1];   curve: L_t(w(γ));   Gap_t = L_t(w_merge) − L_t(w_t)

w_t is the base with the task's adapter merged in, w_merge the merged encoder, both carrying the task's own head
(:mod:`hf_dpmerge.analysis.task_models`), so the head is the same at every γ. Every floating-point tensor of
the two state dicts is interpolated with ``torch.lerp``, which is exact at γ = 0 and γ = 1. The task's primary
metric is recorded beside the loss at every γ.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from hf_dpmerge.analysis.batching import Batch, labels_in_order
from hf_dpmerge.analysis.task_loss import evaluate_loss
from hf_dpmerge.data.metrics import compute_metrics, predictions_from_logits
from hf_dpmerge.data.tasks import TaskSpec

DEFAULT_GAMMAS = tuple(i / 10 for i in range(11))


@dataclass
class InterpolationCurve:
    """L_t and the primary ``metric`` at each γ (ascending, 0 and 1 included)."""

    gammas: list[float]
    losses: list[float]
    scores: list[float]
    metric: str

    @property
    def merge_gap(self) -> float:
        """Gap_t = L_t(w(1)) − L_t(w(0))."""
        return self.losses[-1] - self.losses[0]

    def to_dict(self) -> dict:
        return {"gamma": self.gammas, "loss": self.losses, self.metric: self.scores, "merge_gap": self.merge_gap}


def interpolation_gammas(gammas: Sequence[float]) -> list[float]:
    """Sorted distinct γ values with 0 and 1 added (the gap needs both ends); each must lie in [0, 1]."""
    bad = [g for g in gammas if not (math.isfinite(g) and 0 <= g <= 1)]
    if bad:
        raise ValueError(f"interpolation coefficients must lie in [0, 1], got {bad}")
    return sorted({0.0, 1.0, *map(float, gammas)})


@torch.no_grad()
def interpolation_curve(task_model: torch.nn.Module, merged_model: torch.nn.Module, batches: Sequence[Batch],
                        spec: TaskSpec, gammas: Sequence[float] = DEFAULT_GAMMAS) -> InterpolationCurve:
    """L_t((1 − γ)·w_t + γ·w_merge) for each γ; ``task_model`` holds w(γ) meanwhile and w_t again afterwards."""
    gammas = interpolation_gammas(gammas)
    state, end = task_model.state_dict(), merged_model.state_dict()
    if set(state) != set(end):
        raise ValueError(f"the task and merged models have different tensors: "
                         f"{sorted(set(state) ^ set(end))[:5]}")
    mismatched = [n for n in state if state[n].shape != end[n].shape]
    if mismatched:
        raise ValueError(f"the task and merged models differ in shape at {mismatched[:5]}")
    names = [n for n, t in state.items() if t.is_floating_point()]
    start = {n: state[n].clone() for n in names}
    targets = {n: end[n].to(state[n].device, state[n].dtype) for n in names}
    references = labels_in_order(batches)
    losses, scores = [], []
    try:
        for gamma in gammas:
            for name in names:
                state[name].copy_(torch.lerp(start[name], targets[name], gamma))
            evaluation = evaluate_loss(task_model, batches)
            predictions = predictions_from_logits(spec, evaluation.logits)
            losses.append(evaluation.loss)
            scores.append(compute_metrics(spec, predictions, references)[spec.metric])
    finally:
        for name in names:
            state[name].copy_(start[name])
    return InterpolationCurve(gammas, losses, scores, spec.metric)


def plot_interpolation(panels: Mapping[str, Mapping[str, InterpolationCurve]], path: str | os.PathLike,
                       title: str = "Loss from each task's model (γ = 0) to the merged model (γ = 1)") -> Path:
    """One panel per task (``panels`` key), one line per labelled curve in it; saved as PNG."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    if not panels:
        raise ValueError("no interpolation curves to plot")
    columns = min(4, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 3.0 * rows + 0.6), squeeze=False)
    for ax, (task, curves) in zip(axes.flat, panels.items()):
        for label, curve in curves.items():
            ax.plot(curve.gammas, curve.losses, marker="o", markersize=3, label=label)
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("γ")
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if any(labels):
        fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 0.96))
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
