"""DP training on a cached prefix: the frozen bottom of the model runs once per example, every step runs the top.

Split the model at b, the lowest layer holding a trainable parameter (b = L when only the task head trains). The
bottom (embeddings + layers[:b]) is a fixed public function f_b of each example, computed once in evaluation mode
and kept for the run's real tokens only (:class:`PrefixRows`, never released); each step runs the top on it:

    g̃ = ( Σ_{i∈B} clip_C(∇_θ ℓ(top_θ(f_b(x_i)), y_i)) + N(0, σ²C²I) ) / B_exp,   B ~ Poisson(q)

the full model's per-sample gradient exactly: the same mechanism on less arithmetic. Sampling, clipping, noise,
SAM modes, the accountant and the release are :class:`DPSAMTrainer`'s. A decoder classifier's row is cached up to
its last non-padding token; on causal LMs the LM head runs at the answer positions only. See docs/design.md §16.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import datasets
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from hf_dpmerge.modeling.per_example_loss import per_example_loss
from hf_dpmerge.modeling.pooled_features import classifier_head, head_inputs, last_token_index, task_head
from hf_dpmerge.modeling.prefix_split import bottom_skipped, boundary_inputs, layer_stack, trainable_boundary
from hf_dpmerge.modeling.unwrapped import unwrapped_model
from hf_dpmerge.training.dpsam_trainer import DPSAMTrainer

CACHE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
CACHE_PREFIX_CHOICES = ("auto", "true", "false")
TOKEN_COLUMNS = ("input_ids", "attention_mask", "token_type_ids")
IGNORE_INDEX = -100


class PrefixRows(Dataset):
    """The cached boundary states of a dataset: row i's states ``states[offsets[i]:offsets[i+1]]`` (its real
    tokens, or its one pooled vector at b = L) and its labels (one per row, or one per token for causal LMs)."""

    def __init__(self, states: torch.Tensor, offsets: torch.Tensor, labels: torch.Tensor | None,
                 token_labels: bool = False):
        self.states, self.offsets, self.labels, self.token_labels = states, offsets, labels, token_labels

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> tuple[PrefixRows, int]:
        return self, index

    def gather(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """Rows ``rows`` right-padded to the longest: ``inputs_embeds`` [b, T, d] (storage dtype),
        ``attention_mask`` [b, T] and ``labels`` ([b], or [b, T] padded with -100)."""
        starts, lengths = self.offsets[rows], self.offsets[rows + 1] - self.offsets[rows]
        width = int(lengths.max()) if len(rows) else 1
        columns = torch.arange(width)
        mask = columns[None, :] < lengths[:, None]
        index = torch.where(mask, starts[:, None] + columns[None, :], 0)
        states = self.states[index] * mask[..., None].to(self.states.dtype)
        batch = {"inputs_embeds": states, "attention_mask": mask.long()}
        if self.labels is not None:
            batch["labels"] = (torch.where(mask, self.labels[index], IGNORE_INDEX) if self.token_labels
                               else self.labels[rows])
        return batch


def collate_prefix_rows(items: list[tuple[PrefixRows, int]]) -> dict[str, torch.Tensor]:
    """A batch of :class:`PrefixRows` items (a training draw, or an evaluation batch of another table)."""
    table = items[0][0]
    return table.gather(torch.as_tensor([row for _, row in items], dtype=torch.long))


def _row_labels(dataset: datasets.Dataset) -> list[Any] | None:
    name = next((c for c in ("labels", "label") if c in dataset.column_names), None)
    return dataset[name] if name is not None else None


def is_decoder_classifier(model: nn.Module) -> bool:
    """A decoder's sequence classifier (Llama-family ``…ForSequenceClassification``): its head reads one position,
    the row's last non-padding token."""
    return classifier_head(model) is not None and layer_stack(model).embeddings_name is None


@torch.no_grad()
def build_prefix_rows(model: nn.Module, boundary_module: nn.Module, dataset: datasets.Dataset, collator: Any,
                      batch_size: int, dtype: torch.dtype) -> PrefixRows:
    """Run the bottom of ``model`` (evaluation mode) over a tokenised ``dataset``, rows sorted by length, and keep
    each row's boundary states (the input of ``boundary_module``) at its real tokens, in ``dtype``."""
    tokens = dataset.select_columns([c for c in TOKEN_COLUMNS if c in dataset.column_names])
    lengths = torch.as_tensor([len(ids) for ids in dataset["input_ids"]])
    per_row: list[torch.Tensor | None] = [None] * len(dataset)
    at_head = boundary_module is classifier_head(model)
    up_to_last_token = not at_head and is_decoder_classifier(model)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        order = torch.sort(lengths, descending=True, stable=True).indices.tolist()
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            batch = {k: v.to(device) for k, v in collator([tokens[i] for i in rows]).items() if v is not None}
            batch.setdefault("attention_mask", torch.ones_like(batch["input_ids"]))  # unpadded rows
            states = boundary_inputs(model, boundary_module, batch)
            if at_head:  # the head's input: one vector per row
                states = head_inputs(model, states, batch["input_ids"])
            states, mask = states.to("cpu", dtype), batch["attention_mask"].bool().cpu()
            if up_to_last_token:  # causal attention: the tokens after the head's token change nothing up to it
                last = last_token_index(batch["input_ids"], unwrapped_model(model).config.pad_token_id).cpu()
                mask &= torch.arange(mask.shape[1])[None, :] <= last[:, None]
            for j, row in enumerate(rows):
                per_row[row] = states[j][mask[j]] if states.dim() == 3 else states[j][None]
    finally:
        model.train(was_training)
    counts = torch.as_tensor([len(s) for s in per_row])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    states = torch.cat(per_row) if per_row else torch.zeros(0, 0, dtype=dtype)
    if not torch.isfinite(states).all():
        raise ValueError(f"the cached states overflow {dtype}: pass --cache_dtype float32")
    labels = _row_labels(dataset)
    token_level = labels is not None and len(labels) > 0 and isinstance(labels[0], list)
    if labels is not None:
        labels = torch.as_tensor([t for row in labels for t in row] if token_level else labels)
        if token_level and len(labels) != len(states):
            raise ValueError("token labels must have one entry per real token of each row")
    return PrefixRows(states, offsets, labels, token_level)


def prefix_cache_key(model: nn.Module, boundary: int, dataset: datasets.Dataset, dtype: str) -> str:
    """What determines a dataset's cached states: the model class, b, the storage dtype, the tokenised dataset
    (its ``datasets`` fingerprint: the data and every transform that made it) and the bottom's weights (every
    parameter and buffer outside layers[b:] and the head, bytes hashed)."""
    stack, base = layer_stack(model), unwrapped_model(model)
    top = {id(t) for layer in list(stack.layers)[boundary:] for t in [*layer.parameters(), *layer.buffers()]}
    digest = hashlib.sha256(f"{type(base).__name__}|{boundary}|{dtype}|{dataset._fingerprint}".encode())
    for name, tensor in sorted([*stack.backbone.named_parameters(), *stack.backbone.named_buffers()]):
        if id(tensor) not in top:
            digest.update(name.encode())
            digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()[:32]


def prefix_boundary(model: nn.Module) -> tuple[int | None, str]:
    """(b, why not) for a peft model: b when a prefix can be cached (BERT-family classifiers, Llama-family causal
    LMs, a frozen bottom), else None and the reason."""
    try:
        stack = layer_stack(model)
    except ValueError as err:
        return None, str(err)
    base = unwrapped_model(model)
    head = classifier_head(model)
    if head is None and base.get_output_embeddings() is None:
        return None, f"{type(base).__name__} has neither a 'classifier' head nor an LM head"
    boundary = trainable_boundary(model, head)
    if boundary is None:
        return None, "a parameter below the layers (the embeddings) is trainable: no prefix is frozen"
    if boundary == 0:
        return None, "the lowest layer is trainable: there is no frozen prefix to cache"
    if head is None and boundary == len(stack.layers):
        return None, "nothing in the layers trains"
    return boundary, ""


class CachedPrefixTrainer(DPSAMTrainer):
    """:class:`DPSAMTrainer` whose steps run the model's top on cached boundary states (module docstring).

    Takes the tokenised datasets and token collator a :class:`DPSAMTrainer` takes; evaluation and prediction
    datasets are cached the same way. ``cache_dtype`` stores the states (computed in float32)."""

    def __init__(self, model: nn.Module, args: Any, train_dataset: Any = None, *, cache_dtype: str = "float16",
                 prefix_cache_dir: str | os.PathLike | None = None, **kwargs: Any):
        if cache_dtype not in CACHE_DTYPES:
            raise ValueError(f"--cache_dtype must be one of {sorted(CACHE_DTYPES)}, got {cache_dtype!r}")
        boundary, why = prefix_boundary(model)
        if boundary is None:
            raise ValueError(f"no cached prefix: {why}; train with --cache_prefix false")
        self.boundary, self.cache_dtype = boundary, cache_dtype
        self.decoder_classifier = is_decoder_classifier(model)
        self.prefix_cache_dir = None if prefix_cache_dir is None else Path(prefix_cache_dir)
        if self.prefix_cache_dir is not None and self.prefix_cache_dir.exists() and not self.prefix_cache_dir.is_dir():
            raise ValueError(f"--prefix_cache_dir {prefix_cache_dir}: exists and is not a directory")
        self.num_layers = len(layer_stack(model).layers)
        self.causal = classifier_head(model) is None
        super().__init__(model=model, args=args, train_dataset=train_dataset, **kwargs)
        self.token_collator = self.data_collator
        self.train_dataset = self.cached(self.train_dataset)
        if isinstance(self.eval_dataset, datasets.Dataset):
            self.eval_dataset = self.cached(self.eval_dataset)
        if self.anchor_rows is not None:  # the public anchor's rows run the top only, like the training rows
            self.anchor_rows = self.cached(self.anchor_rows)
        self.data_collator = collate_prefix_rows

    @property
    def top_layers(self) -> int:
        """k = L − b, the layers every step runs (0: the head alone)."""
        return self.num_layers - self.boundary

    def cached(self, dataset: datasets.Dataset) -> PrefixRows:
        """``dataset`` (tokenised) as :class:`PrefixRows` of this model's boundary states; with a
        ``prefix_cache_dir``, read from there when an earlier run stored them under :func:`prefix_cache_key`,
        else built and stored there (written whole, then renamed: a killed run leaves no partial file)."""
        model = self.accelerator.unwrap_model(self.model)
        path = None
        if self.prefix_cache_dir is not None:
            key = prefix_cache_key(model, self.boundary, dataset, self.cache_dtype)
            path = self.prefix_cache_dir / f"prefix-{key}.pt"
            if path.is_file():
                return PrefixRows(**torch.load(path, weights_only=True))
        module = task_head(model) if self.top_layers == 0 else layer_stack(model).layers[self.boundary]
        rows = build_prefix_rows(model, module, dataset, self.token_collator, self.args.per_device_eval_batch_size,
                                 CACHE_DTYPES[self.cache_dtype])
        if path is not None and self.accelerator.is_local_main_process:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.partial")
            torch.save({"states": rows.states, "offsets": rows.offsets, "labels": rows.labels,
                        "token_labels": rows.token_labels}, partial)
            os.replace(partial, path)
        return rows

    def _rows(self, dataset: Any) -> Any:
        return self.cached(dataset) if isinstance(dataset, datasets.Dataset) else dataset

    def evaluate(self, eval_dataset: Any = None, *args: Any, **kwargs: Any):
        return super().evaluate(self._rows(eval_dataset), *args, **kwargs)

    def predict(self, test_dataset: Any, *args: Any, **kwargs: Any):
        return super().predict(self._rows(test_dataset), *args, **kwargs)

    def train(self, *args: Any, **kwargs: Any):
        """Train; the head alone (k = 0) on one CPU thread: its ops are so small that intra-op threads cost more
        than they save (measured: 3 ms against 90 ms per 1024-row step on a busy 2-core machine)."""
        threads = torch.get_num_threads()
        if self.top_layers == 0:
            torch.set_num_threads(1)
        try:
            return super().train(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)

    def _set_signature_columns_if_needed(self) -> None:
        if self._signature_columns is None:
            self._signature_columns = ["inputs_embeds", "attention_mask", "labels", "label", "label_ids"]

    @staticmethod
    def _states(model: nn.Module, features: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached states in the model's compute dtype (float32 in training; --fp16_full_eval casts the model
        for prediction), and their attention mask."""
        return features["inputs_embeds"].to(next(model.parameters()).dtype), features["attention_mask"]

    def _logits(self, model: nn.Module, features: dict[str, Any]) -> torch.Tensor:
        states, mask = self._states(model, features)
        if self.top_layers == 0:
            return task_head(model)(states[:, 0])
        with bottom_skipped(model, self.boundary) as stack:
            if not self.decoder_classifier:
                return model(inputs_embeds=states, attention_mask=mask).logits
            # a row's cached tokens end at its last non-padding token (build_prefix_rows): the head reads the last
            hidden = stack.backbone(inputs_embeds=states, attention_mask=mask).last_hidden_state
        last = mask.sum(dim=1) - 1
        return task_head(model)(hidden[torch.arange(len(hidden), device=hidden.device), last])

    def _answer_logits(self, model: nn.Module, features: dict[str, Any],
                       labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal LMs: the LM head at the answer positions only: logits [b, w, V] and the tokens they predict
        [b, w], w the most answer tokens of a row (-100 past a row's own)."""
        states, mask = self._states(model, features)
        with bottom_skipped(model, self.boundary) as stack:
            hidden = stack.backbone(inputs_embeds=states, attention_mask=mask).last_hidden_state
        targets = labels[:, 1:]
        answer = targets != IGNORE_INDEX
        width = max(int(answer.sum(dim=1).max()), 1) if len(labels) else 1
        positions = torch.sort(answer.int(), dim=1, descending=True, stable=True).indices[:, :width]
        chosen = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
        return model.get_base_model().get_output_embeddings()(chosen), targets.gather(1, positions)

    def _example_losses(self, model: nn.Module, features: dict[str, Any], labels: torch.Tensor) -> torch.Tensor:
        """Classifiers: DPSAMTrainer's. Causal LMs: the mean answer-token loss, the LM head at answer positions only
        (at every position under ``per_example``)."""
        # per_example's functional per-example pass cannot take a data-dependent width: the LM head at every position
        if not self.causal or self.args.sam_mode == "per_example":
            return super()._example_losses(model, features, labels)
        logits, targets = self._answer_logits(model, features, labels)
        token_loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                     ignore_index=IGNORE_INDEX, reduction="none").view(targets.shape)
        return token_loss.sum(dim=1) / (targets != IGNORE_INDEX).sum(dim=1).clamp(min=1)

    def prediction_step(self, model: nn.Module, inputs: dict[str, Any], prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None):
        """The top's logits on cached rows (and the mean loss when labelled)."""
        inputs = self._prepare_inputs(inputs)
        labels = inputs.get("labels")
        features = {k: v for k, v in inputs.items() if k != "labels"}
        model = self.accelerator.unwrap_model(model)
        with torch.no_grad():
            logits = self._logits(model, features)
            loss = None
            if labels is not None:
                losses = self._example_losses(model, features, labels) if self.causal else per_example_loss(logits,
                                                                                                            labels)
                loss = losses.mean()
        return (loss, None, None) if prediction_loss_only else (loss, logits, labels)

    def _record_extra(self) -> dict[str, Any]:
        """DPSAMTrainer's, plus ``cached_prefix``: where the model was split and how the states were kept."""
        head = ({"lm_head": "answer positions only" if self.args.sam_mode != "per_example" else "all"} if self.causal
                else {"head_reads": "the last non-padding token"} if self.decoder_classifier else {})
        return {**super()._record_extra(), "cached_prefix": {
            "boundary_layer": self.boundary, "top_layers": self.top_layers, "cache_dtype": self.cache_dtype,
            "frozen_part": "evaluation mode (no dropout)", **head}}


def dp_trainer(model: nn.Module, args: Any, *, cache_prefix: str = "auto", cache_dtype: str = "float16",
               prefix_cache_dir: str | os.PathLike | None = None, **kwargs: Any) -> DPSAMTrainer:
    """The trainer of a run: :class:`CachedPrefixTrainer` with ``cache_prefix='true'`` (refused when no prefix is
    frozen) or ``'auto'`` when one is, else :class:`DPSAMTrainer` (``kwargs``: theirs)."""
    if cache_prefix not in CACHE_PREFIX_CHOICES:
        raise ValueError(f"--cache_prefix must be one of {CACHE_PREFIX_CHOICES}, got {cache_prefix!r}")
    boundary, why = prefix_boundary(model) if cache_prefix != "false" else (None, "")
    if cache_prefix == "true" and boundary is None:
        raise ValueError(f"--cache_prefix true: {why}; pass --cache_prefix auto or false")
    if boundary is None:
        return DPSAMTrainer(model=model, args=args, **kwargs)
    return CachedPrefixTrainer(model=model, args=args, cache_dtype=cache_dtype, prefix_cache_dir=prefix_cache_dir,
                               **kwargs)
