"""What DPSAMTrainer refuses before training starts, and at each step, with errors that name the problem.

- The adapter: peft adapters must be LoRA; under DP with opacus hooks (every ``sam_mode`` but
  ``per_example``) DoRA layers are refused too, since opacus has no per-sample-gradient rule for them.
- The labels of a sequence classifier: the dataset needs a label column, and every class id must lie in
  [0, num_labels) of the model (cross-entropy would index past the head).
- The training set must be tokenized (``input_ids``): a raw-text ``datasets.Dataset`` is refused, with the
  ``map`` call that tokenizes it (Trainer would drop its text column and fail deep in the collator).
- The training set must have a size N (q = B_exp/N); under DP the model must not use gradient
  checkpointing (per-sample gradients need the forward activations it discards), its trainable parameters
  must be float32 or wider (the clipped sums and the noise take their dtype), and no callback may select
  the model on evaluation data unless that data is declared public (``eval_data_is_public``).
- Each step: the loss and the (privatised) gradient must be finite; training stops at the first step where
  they are not, before the weights change, so no NaN/inf adapter or privacy record is ever saved.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import datasets
import numpy as np
import torch
from torch import nn
from transformers import EarlyStoppingCallback

from hf_dpmerge.lora import UnsupportedAdapterError
from hf_dpmerge.modeling.unwrapped import unwrapped_model

LABEL_COLUMNS = ("label", "labels", "label_ids")


def check_adapter_type(model: nn.Module, dp: bool, sam_mode: str) -> None:
    """Refuse non-LoRA peft adapters, and DoRA layers where opacus computes the per-sample gradients."""
    from peft.tuners.lora import LoraLayer

    for name, config in getattr(model, "peft_config", {}).items():
        peft_type = getattr(config.peft_type, "value", config.peft_type)
        if peft_type != "LORA":
            raise UnsupportedAdapterError(
                f"adapter {name!r} is {peft_type}: DPSAMTrainer trains LoRA adapters only (per-sample gradients, "
                "the alignment penalty and the merge methods assume LoRA layers)"
            )
    if dp and sam_mode != "per_example":
        for name, module in model.named_modules():
            if isinstance(module, LoraLayer) and any(module.use_dora.values()):
                raise UnsupportedAdapterError(
                    f"{name}: DoRA layers (use_dora=True) have no opacus per-sample gradient rule; use plain LoRA, "
                    "or sam_mode='per_example' (the alignment penalty and the merge methods refuse DoRA too)"
                )


def _sequence_classes(model: nn.Module) -> int | None:
    """num_labels of a single-label sequence classifier, else None."""
    base = unwrapped_model(model)
    config = getattr(base, "config", None)
    if not type(base).__name__.endswith("ForSequenceClassification") or config is None:
        return None
    if config.num_labels < 2 or config.problem_type in ("regression", "multi_label_classification"):
        return None
    return config.num_labels


def check_labels(dataset: Any, model: nn.Module, label_names: Sequence[str] | None = None) -> None:
    """A sequence classifier's ``datasets.Dataset`` has a label column whose ids all lie in [0, num_labels)."""
    num_labels = _sequence_classes(model)
    if num_labels is None or not isinstance(dataset, datasets.Dataset):
        return
    candidates = list(label_names or LABEL_COLUMNS)
    column = next((c for c in candidates if c in dataset.column_names), None)
    if column is None:
        raise ValueError(
            f"train_dataset has no label column (looked for {candidates}; it has {dataset.column_names}): "
            f"a sequence classifier with num_labels={num_labels} needs a class id per example"
        )
    labels = np.asarray(dataset.with_format("numpy")[column])
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"train_dataset column {column!r} holds {labels.dtype} values, not integer class ids")
    unseen = np.unique(labels[(labels < 0) | (labels >= num_labels)])
    if unseen.size:
        count = int(np.isin(labels, unseen).sum())
        raise ValueError(
            f"train_dataset column {column!r} holds class ids {unseen[:10].tolist()} outside [0, {num_labels}) "
            f"of the model's num_labels={num_labels} ({count} rows): build the model with enough labels or drop them"
        )


def check_finite_step(step: int, loss: torch.Tensor, gradient: Sequence[torch.Tensor], names: Sequence[str]) -> None:
    """Stop at a NaN/inf loss or gradient, naming the step (and the parameter)."""
    finite = torch.stack([torch.isfinite(loss).all(), *(torch.isfinite(g).all() for g in gradient)])
    if bool(finite.all()):
        return
    if not bool(finite[0]):
        problem = f"the training loss is {loss.item()}"
    else:
        problem = f"the gradient of {names[int((~finite[1:]).nonzero()[0])]} holds NaN or infinite values"
    raise FloatingPointError(
        f"step {step}: {problem} (NaN/inf weights or inputs, or a learning rate that diverges); training "
        "stopped before the update, and no adapter or privacy record was saved"
    )


def check_tokenized(dataset: Any, what: str = "train_dataset") -> None:
    """Refuse a ``datasets.Dataset`` of raw text (string columns, no ``input_ids``), naming how to tokenize it."""
    if not isinstance(dataset, datasets.Dataset) or "input_ids" in dataset.column_names:
        return
    text = [name for name, feature in dataset.features.items()
            if isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")]
    if text:
        columns = ", ".join(f"batch[{name!r}]" for name in text[:2])
        raise ValueError(
            f"{what} holds raw text (columns {text}) and no input_ids: DPSAMTrainer trains on token ids. Tokenize it "
            f"first, e.g. {what}.map(lambda batch: tokenizer({columns}, truncation=True), batched=True), or use "
            "hf_dpmerge.data.tokenize_task for a packaged task"
        )


def check_sized_dataset(dataset: Any) -> None:
    """Refuse an iterable (streaming) dataset: the sample rate q = B_exp/N needs its size N."""
    if isinstance(dataset, (torch.utils.data.IterableDataset, datasets.IterableDataset)) or not hasattr(
        dataset, "__len__"
    ):
        raise TypeError(
            f"train_dataset is a {type(dataset).__name__} without a length: Poisson sampling and the privacy "
            "accounting need the training set's size N (sample rate q = B_exp/N) and random access to its rows; "
            "materialise it (e.g. datasets.Dataset.from_generator, or load_dataset without streaming=True)"
        )


def check_no_gradient_checkpointing(model: nn.Module) -> None:
    """Refuse a model with gradient checkpointing on: per-sample gradients need the forward activations."""
    if any(getattr(module, "gradient_checkpointing", False) is True for module in model.modules()):
        raise ValueError(
            "the model has gradient checkpointing enabled, which DP training does not support: per-sample "
            "gradients need each layer's activations from the forward pass, which checkpointing discards and "
            "recomputes inside backward; call model.gradient_checkpointing_disable() (and keep "
            "gradient_checkpointing=False) and lower physical_batch_size to save memory instead"
        )


def check_full_precision_trainable(named: Sequence[tuple[str, torch.Tensor]]) -> None:
    """Refuse trainable float16/bfloat16 parameters under DP: the clipped sums and the Gaussian noise take the
    parameters' dtype, so the noise would be rounded to 8 (bf16) or 11 (fp16) significant bits."""
    half = {name: p.dtype for name, p in named if p.dtype in (torch.float16, torch.bfloat16)}
    if half:
        dtypes = ", ".join(sorted({str(d).removeprefix("torch.") for d in half.values()}))
        names = ", ".join(list(half)[:3]) + (f" and {len(half) - 3} more" if len(half) > 3 else "")
        raise ValueError(
            f"{len(half)} trainable parameters are {dtypes} ({names}): DP training adds its Gaussian noise in the "
            "trainable parameters' dtype, which half precision would round; load the model in float32 "
            "(from_pretrained(..., torch_dtype=torch.float32) or model.float()) before peft.get_peft_model "
            "(a half-precision frozen base is fine as long as the adapter weights are float32)"
        )


def check_no_model_selection(callbacks: Sequence[Any]) -> None:
    """Refuse early stopping under DP: it selects the model on evaluation data the guarantee does not cover."""
    stopping = [type(c).__name__ for c in callbacks if isinstance(c, EarlyStoppingCallback)]
    if stopping:
        raise ValueError(
            f"{', '.join(stopping)} selects the model on evaluation data, which the DP guarantee does not cover "
            "when that data is private; remove the callback, or set eval_data_is_public=True if the evaluation "
            "data is public (the privacy record says so)"
        )


def check_anchor_rows(anchor_rows: Any, anchor_lambda: float, train_dataset: Any) -> None:
    """The public anchor needs its rows, and rows need a weight: tokenised causal-LM rows (token labels), for a
    causal LM's training (its training rows have token labels too)."""
    if anchor_lambda > 0 and anchor_rows is None:
        raise ValueError(f"anchor_lambda={anchor_lambda:g} needs the public anchor's rows (anchor_rows=, built by "
                         "hf_dpmerge.training.public_anchor.anchor_rows; examples/train_causal_lm.py builds them from "
                         "--anchor_prompts): set --anchor_lambda 0 to train without the anchor")
    if anchor_rows is None:
        return
    if anchor_lambda == 0:
        raise ValueError("anchor_rows were given but anchor_lambda is 0, so they would not be used: set "
                         "--anchor_lambda > 0")
    if (not isinstance(anchor_rows, datasets.Dataset) or "labels" not in anchor_rows.column_names
            or not len(anchor_rows)):
        raise ValueError("anchor_rows must be a non-empty datasets.Dataset with input_ids and labels")
    check_tokenized(anchor_rows, "anchor_rows")
    train_row = train_dataset[0] if isinstance(train_dataset, datasets.Dataset) and len(train_dataset) else {}
    train_labels = train_row.get("labels", train_row.get("label", []))
    if not isinstance(anchor_rows[0]["labels"], list) or not isinstance(train_labels, list):
        raise ValueError("the public anchor is for causal LMs: anchor_rows need one label per token "
                         "(set --anchor_lambda 0 for a sequence classifier)")
