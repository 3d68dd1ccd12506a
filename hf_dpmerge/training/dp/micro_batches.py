"""Physical micro-batches of one Poisson draw, formed by length (docs/design.md §16).

A draw is collated padded to its longest row. Its rows are sorted by length (longest first, ties in draw order)
and cut into micro-batches of ``size`` rows, each trimmed to its own longest row: padding is computed once per
micro-batch instead of once per draw. The draw's membership, each row's per-sample gradient (padding is masked)
and the clipped sum are unchanged, so the mechanism is the same; only the arithmetic is smaller. Rows are
trimmed only when every row is right-padded (its attention mask a run of ones then zeros): left padding would
move the real tokens' absolute positions.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


def right_padded_lengths(features: dict[str, Any]) -> torch.Tensor | None:
    """Each row's length when ``attention_mask`` is a right-padded [b, T] mask, else None."""
    mask = features.get("attention_mask")
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        return None
    lengths = mask.sum(dim=1)
    columns = torch.arange(mask.shape[1], device=mask.device)
    if not torch.equal(mask.bool(), columns[None, :] < lengths[:, None]):
        return None
    return lengths


def micro_batches(features: dict[str, Any], labels: torch.Tensor, size: int
                  ) -> Iterator[tuple[dict[str, Any], torch.Tensor, torch.Tensor]]:
    """(features, labels, row indices into the draw) of each micro-batch of at most ``size`` rows."""
    batch = labels.shape[0]
    lengths = right_padded_lengths(features)
    order = (torch.arange(batch, device=labels.device) if lengths is None
             else torch.sort(lengths, descending=True, stable=True).indices)
    width = None if lengths is None else features["attention_mask"].shape[1]
    for start in range(0, batch, size):
        rows = order[start : start + size]
        micro = {k: v[rows] if isinstance(v, torch.Tensor) else v for k, v in features.items()}
        micro_labels = labels[rows]
        if lengths is not None:
            keep = max(int(lengths[rows].max()), 1)
            micro = {k: v[:, :keep] if _is_token_axis(v, width) else v for k, v in micro.items()}
            micro_labels = micro_labels[:, :keep] if _is_token_axis(micro_labels, width) else micro_labels
        yield micro, micro_labels, rows


def _is_token_axis(value: Any, width: int) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[1] == width
