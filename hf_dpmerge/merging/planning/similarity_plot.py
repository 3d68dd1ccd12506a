"""The heatmap ``hf-dpmerge similarity`` saves: the cosine matrix of :mod:`.task_similarity`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hf_dpmerge.merging.planning.task_similarity import SimilarityReport


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
