"""A prompt → completion task (own data, ``--prompt_column``/``--completion_column``) as causal-LM rows.

Each row is the prompt, rendered as a user turn (:func:`~hf_dpmerge.data.instructions.render_prompt`: the chat
template when the tokenizer has one), then the completion and the end-of-sequence token; the prompt's labels are
-100, so the loss is the completion's alone, and one row is one privacy unit unless a unit column says otherwise.
A completion keeps at most half of ``max_length`` tokens; the prompt's text is cut to what is left.
"""

from __future__ import annotations

import datasets
from transformers import PreTrainedTokenizerBase

from hf_dpmerge.data.instructions import answer_end_ids, render_prompt, token_ids, training_rows
from hf_dpmerge.data.tasks import TaskSpec
from hf_dpmerge.data.tokenize import dropped_columns

_TEXT_SLOT = "\u2063PROMPT\u2063"


class CompletionEncoder:
    """Token ids of prompt → completion rows for one tokenizer and ``max_length``."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_length: int, answer_end: bool = True):
        self.tokenizer, self.max_length = tokenizer, max_length
        self.before, self.after = (token_ids(tokenizer, part) for part in render_prompt(tokenizer, _TEXT_SLOT).split(
            _TEXT_SLOT))
        self.end = answer_end_ids(tokenizer) if answer_end else []
        if max_length // 2 + len(self.before) + len(self.after) + len(self.end) >= max_length:
            raise ValueError(f"--max_length {max_length} leaves no room for a prompt after the chat template "
                             f"({len(self.before) + len(self.after)} tokens): raise --max_length")

    def row(self, prompt: str, completion: str) -> tuple[list[int], list[int]]:
        """(prompt ids, response ids: the completion cut to ``max_length // 2`` tokens, then the end)."""
        response = token_ids(self.tokenizer, completion)[:self.max_length // 2] + self.end
        budget = self.max_length - len(self.before) - len(self.after) - len(response)
        return self.before + token_ids(self.tokenizer, prompt)[:budget] + self.after, response


def tokenize_completions(dsd, spec: TaskSpec, tokenizer: PreTrainedTokenizerBase, max_length: int = 128,
                         keep_columns: tuple[str, ...] = (), train_answer_end: bool = True):
    """Training rows (``input_ids``, ``attention_mask``, ``labels``) of every split of ``dsd``: prompt + completion
    + end, ``labels`` -100 on the prompt (and on the end with ``train_answer_end=False``); other columns except
    ``keep_columns`` dropped. Pad per batch with ``DataCollatorForSeq2Seq``."""
    encoder = CompletionEncoder(tokenizer, max_length)
    untrained_end = not train_answer_end and tokenizer.eos_token_id is not None

    def encode(batch: dict) -> dict:
        return training_rows(map(encoder.row, batch["prompt"], batch["completion"]), untrained_end)

    return dsd.map(encode, batched=True, remove_columns=dropped_columns(dsd, spec, keep_columns),
                   desc=f"completions for {spec.name}")


def completion_rows(dataset: datasets.Dataset, tokenizer: PreTrainedTokenizerBase, max_length: int = 128,
                    answer_end: bool = True) -> list[tuple[list[int], list[int]]]:
    """Each row's (prompt ids, response ids) of a loaded split, for scoring (``answer_end=False``: the response
    without the end-of-sequence token, for an adapter trained without it)."""
    encoder = CompletionEncoder(tokenizer, max_length, answer_end)
    return [encoder.row(row["prompt"], row["completion"]) for row in dataset]
