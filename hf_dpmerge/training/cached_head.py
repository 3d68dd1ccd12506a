"""The head-only release ("base encoder + own head") trained on cached pooled features (docs/design.md §15.1).

With the LoRA factors frozen at B = 0 the encoder is the base's, a fixed public function f, and the task head
h_θ is the only trainable part: logits = h_θ(f(x)). The pooled features f(x) (the head module's input, pooled
as the base's ``classifier_pooling`` says) are computed once, in evaluation mode, and every step runs only the
head on them:

    g̃ = ( Σ_{i∈B} clip_C(∇_θ ℓ(h_θ(f(x_i)), y_i)) + N(0, σ²C²I) ) / B_exp,   B ~ Poisson(q)

which is the full-model step's per-sample gradient exactly when dropout is off (evaluation-mode features drop
no units). Sampling, clipping, noise, accountant, record and release are :class:`DPSAMTrainer`'s, and the model
it saves is the same peft adapter (frozen LoRA, trained head) as a head-only run through the full model.
Computing f(x) touches no privacy budget by itself: f is public and the features never leave the process; only
θ is released, through the accounted mechanism.
"""

from __future__ import annotations

from typing import Any

import datasets
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch import nn
from torch.utils.data import Dataset
from transformers import default_data_collator

from hf_dpmerge.modeling.per_example_loss import per_example_loss
from hf_dpmerge.modeling.pooled_features import pooled_features, task_head
from hf_dpmerge.training.dpsam_trainer import DPSAMTrainer

FEATURES = "pooled_features"


def with_pooled_features(model: nn.Module, dataset: datasets.Dataset, collator: Any,
                         batch_size: int) -> datasets.Dataset:
    """``dataset`` with its token columns replaced by a ``pooled_features`` column (labels and any other column,
    e.g. a privacy unit, kept)."""
    features = pooled_features(model, dataset, collator, batch_size)
    tokens = [c for c in ("input_ids", "attention_mask", "token_type_ids") if c in dataset.column_names]
    return dataset.remove_columns(tokens).add_column(FEATURES, list(features.numpy()),
                                                     feature=datasets.List(datasets.Value("float32")))


def _column_tensor(dataset: datasets.Dataset, name: str) -> torch.Tensor:
    """A column as one tensor ([N, d] for the feature lists), read from Arrow without per-row conversion."""
    column = dataset.with_format("arrow")[name]
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        return torch.from_numpy(pc.list_flatten(column).to_numpy().reshape(len(dataset), -1).copy())
    return torch.from_numpy(column.to_numpy().copy())


class FeatureRows(Dataset):
    """The features and labels of a :func:`with_pooled_features` dataset as in-memory tensors. Item i is the row
    number i and :meth:`collate` gathers a whole draw at once (a per-row fetch would dominate the head's step)."""

    def __init__(self, dataset: datasets.Dataset):
        self.columns = {name: _column_tensor(dataset, name)
                        for name in dataset.column_names if name in (FEATURES, "label", "labels")}
        self.columns["labels"] = self.columns.pop("label", self.columns.get("labels"))

    def __len__(self) -> int:
        return len(self.columns[FEATURES])

    def __getitem__(self, index: int) -> int:
        return index

    def collate(self, items: list[Any]) -> dict[str, torch.Tensor]:
        """Row numbers: their rows of this table; rows of another dataset (evaluation): stacked as usual."""
        if items and not isinstance(items[0], int):
            return default_data_collator(items)
        rows = torch.as_tensor(items, dtype=torch.long)
        return {name: column[rows] for name, column in self.columns.items()}


class CachedHeadTrainer(DPSAMTrainer):
    """:class:`DPSAMTrainer` over datasets of :func:`with_pooled_features`: each step runs the task head only.

    Every trainable parameter must lie in the head (the head-only floor); ``sam_mode='per_example'`` (which
    differentiates the whole model per example) is refused."""

    needs_token_ids = False  # its rows are pooled features

    def __init__(self, model: nn.Module, args: Any, train_dataset: Any = None, **kwargs: Any):
        if "data_collator" in kwargs:
            raise ValueError("CachedHeadTrainer collates its feature rows itself: pass no data_collator")
        super().__init__(model=model, args=args, train_dataset=train_dataset, **kwargs)
        self.train_dataset = FeatureRows(self.train_dataset)  # its unit column, if any, is split off by now
        self.data_collator = self.train_dataset.collate
        head = {id(p) for p in task_head(self.model).parameters()}
        outside = [n for n, p in zip(self._param_names, self._params) if id(p) not in head]
        if outside:
            raise ValueError(f"cached head training trains the task head only, but {outside[:3]} are trainable: "
                             "freeze the LoRA factors (train_glue.py --train_lora false)")
        if args.sam_mode == "per_example":
            raise ValueError("sam_mode='per_example' is not supported on cached features: use 'none', 'dp_sat' "
                             "or 'two_query' (--sam_mode)")

    def train(self, *args: Any, **kwargs: Any):
        """Train on one CPU thread: the head's ops are so small that intra-op threads cost more than they save
        (measured: 3 ms against 90 ms per 1024-row step on a busy 2-core machine); restored afterwards."""
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return super().train(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)

    def _set_signature_columns_if_needed(self) -> None:
        if self._signature_columns is None:
            self._signature_columns = [FEATURES, "labels", "label", "label_ids"]

    def _logits(self, model: nn.Module, features: dict[str, Any]) -> torch.Tensor:
        return task_head(model)(features[FEATURES])

    def prediction_step(self, model: nn.Module, inputs: dict[str, Any], prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None):
        """Logits of the head on the cached features (and the mean loss when labelled)."""
        inputs = self._prepare_inputs(inputs)
        labels = inputs.get("labels")
        with torch.no_grad():
            logits = self._logits(self.accelerator.unwrap_model(model), inputs)
            loss = per_example_loss(logits, labels).mean() if labels is not None else None
        return (loss, None, None) if prediction_loss_only else (loss, logits, labels)
