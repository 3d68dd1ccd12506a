"""Length-sorted, per-batch padded batches of a tokenized dataset (little padding, rows remembered)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Batch:
    """Rows ``indices`` of the dataset, padded together; ``labels`` is None when the dataset has none."""

    indices: np.ndarray
    inputs: dict[str, torch.Tensor]
    labels: torch.Tensor | None

    def to(self, device: torch.device | str) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        """``(inputs, labels)`` on ``device``."""
        labels = None if self.labels is None else self.labels.to(device)
        return {k: v.to(device) for k, v in self.inputs.items()}, labels


def length_sorted_batches(dataset, tokenizer, batch_size: int = 32) -> list[Batch]:
    """Batches of ``batch_size`` rows in order of length, each padded to its longest row."""
    from transformers import DataCollatorWithPadding

    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    collate = DataCollatorWithPadding(tokenizer)
    columns = {c: list(dataset[c]) for c in dataset.column_names}
    order = np.argsort([len(ids) for ids in columns["input_ids"]], kind="stable")
    batches = []
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        padded = collate([{c: values[i] for c, values in columns.items() if c != "labels"} for i in idx])
        labels = torch.tensor([columns["labels"][i] for i in idx]) if "labels" in columns else None
        batches.append(Batch(idx, dict(padded), labels))
    return batches


def labels_in_order(batches: list[Batch]) -> np.ndarray:
    """The batches' labels put back in dataset order."""
    if not batches:
        raise ValueError("the evaluation set is empty")
    if any(batch.labels is None for batch in batches):
        raise ValueError("the dataset has no labels")
    labels = np.empty(sum(len(batch.indices) for batch in batches), dtype=batches[0].labels.numpy().dtype)
    for batch in batches:
        labels[batch.indices] = batch.labels.numpy()
    return labels
