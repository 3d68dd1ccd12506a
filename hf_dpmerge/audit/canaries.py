"""Audit canaries: random-word texts with random labels, each included in training with probability 1/2.

A canary is ``length`` words drawn at random from the tokenizer's whole-word vocabulary (no special,
``[unused…]`` or ``##`` continuation tokens) in every text column of the task, labelled with a uniformly random
class. Words are drawn without replacement across all canaries when the vocabulary is large enough, so no two
canaries share a word (less interference between them), else with replacement. Such an example has a label
that nothing else predicts, so a model that fits it has memorised that one example. The inclusion draw
S ∈ {in, out}^m (i.i.d. fair coins) is what the one-run audit of Steinke, Nasr & Jagielski (2023) needs;
canaries and draw come from one seeded generator.

For auditing user-level DP a canary is a *unit*: ``rows_per_canary`` such rows (each its own random words)
sharing the canary's label and one unit id; the inclusion draw is per canary, all its rows in or all out.
"""

from __future__ import annotations

from dataclasses import dataclass

import datasets
import numpy as np
from transformers import PreTrainedTokenizerBase

from hf_dpmerge.data.tasks import TaskSpec


def canary_vocabulary(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """The tokenizer's alphabetic whole-word tokens, in id order (special and subword pieces excluded)."""
    special = set(tokenizer.all_special_tokens)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    words = [token for token, _ in vocab if token not in special and token.isalpha()]
    if len(words) < 2:
        raise ValueError("the tokenizer has fewer than two whole-word tokens to build canaries from")
    return words


@dataclass
class Canaries:
    """m canaries of ``rows_per_canary`` rows each (raw text columns + ``label``; canary j's rows are
    j·r … j·r + r − 1) and which canaries training includes."""

    examples: datasets.Dataset
    included: np.ndarray  # bool, shape [m]
    rows_per_canary: int = 1

    @property
    def num_canaries(self) -> int:
        return len(self.included)

    @property
    def canary_of_row(self) -> np.ndarray:
        return np.arange(len(self.examples)) // self.rows_per_canary

    def included_examples(self) -> datasets.Dataset:
        return self.examples.select(np.flatnonzero(self.included[self.canary_of_row]))


def make_canaries(
    tokenizer: PreTrainedTokenizerBase, spec: TaskSpec, *, count: int, length: int, seed: int, rows_per_canary: int = 1
) -> Canaries:
    """``count`` random-word canaries for ``spec``'s text columns, with random labels and a fair-coin draw;
    each canary has ``rows_per_canary`` rows (distinct random words, the canary's label)."""
    if spec.is_regression:
        raise ValueError(f"{spec.name} is a regression task: canaries need class labels")
    if count < 1 or length < 1 or rows_per_canary < 1:
        raise ValueError(
            f"need at least one canary of at least one row of one word, got count={count}, length={length}, "
            f"rows_per_canary={rows_per_canary}"
        )
    words = np.asarray(canary_vocabulary(tokenizer))
    rng = np.random.default_rng(seed)
    columns_count = len(spec.text_columns)
    num_rows = count * rows_per_canary
    needed = num_rows * length * columns_count
    picks = rng.choice(len(words), size=needed, replace=needed > len(words))
    rows = words[picks].reshape(columns_count, num_rows, length)
    columns = {column: [" ".join(row) for row in rows[c]] for c, column in enumerate(spec.text_columns)}
    labels = rng.integers(0, spec.num_labels, size=count)
    included = rng.random(count) < 0.5
    examples = datasets.Dataset.from_dict({**columns, "label": np.repeat(labels, rows_per_canary).tolist()})
    return Canaries(examples=examples, included=included, rows_per_canary=rows_per_canary)
