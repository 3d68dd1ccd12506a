"""``tokenize_task``: model inputs (``input_ids``, ``attention_mask``, ``labels``) for a loaded task."""

from __future__ import annotations

from typing import TypeVar

import datasets
from transformers import PreTrainedTokenizerBase

from hf_dpmerge.data.tasks import TaskSpec

D = TypeVar("D", datasets.Dataset, datasets.DatasetDict)


class MissingColumnError(ValueError):
    """A column to keep through tokenization (e.g. a privacy unit column) is not in the data."""


def tokenize_task(
    dsd: D,
    spec: TaskSpec,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int = 128,
    keep_columns: tuple[str, ...] = (),
) -> D:
    """Tokenize every split of ``dsd`` (a ``DatasetDict`` or one ``Dataset``), unpadded and truncated.

    Sentence pairs are encoded as pairs (``token_type_ids`` kept when the tokenizer makes them) and
    truncated longest-first. All other columns except ``keep_columns`` (e.g. a privacy unit column) are
    dropped; ``label`` becomes ``labels`` (float for regression). Pad per batch with ``DataCollatorWithPadding``.
    """

    def encode(batch: dict) -> dict:
        texts = [batch[column] for column in spec.text_columns]
        encoded = tokenizer(*texts, truncation=True, max_length=max_length)
        labels = batch["label"]
        encoded["labels"] = [float(x) for x in labels] if spec.is_regression else labels
        return encoded

    return dsd.map(encode, batched=True, remove_columns=dropped_columns(dsd, spec, keep_columns),
                   desc=f"tokenizing {spec.name}")


def dropped_columns(dsd: datasets.Dataset | datasets.DatasetDict, spec: TaskSpec,
                    keep_columns: tuple[str, ...]) -> list[str]:
    """The columns of ``dsd`` that tokenizing removes: all but ``keep_columns``, each of which must exist."""
    columns = dsd.column_names
    if isinstance(columns, dict):
        columns = next(iter(columns.values()), [])
    missing = [column for column in keep_columns if column not in columns]
    if missing:
        raise MissingColumnError(f"{spec.name} has no column {missing} to keep (its columns: {columns})")
    return [column for column in columns if column not in keep_columns]
