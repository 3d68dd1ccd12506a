"""Classification tasks written as instructions for a causal language model (docs/design.md §14).

Each example becomes ``prompt → response``: the prompt asks the task's question about the text (through the
tokenizer's chat template when it has one, else ``<question>\\nAnswer:``), the response is the label's
*verbaliser* (``"fresh"``) followed by the end-of-sequence token. For training, the labels of the prompt
tokens are -100, so the causal-LM loss is the response's alone; one example (prompt + response) is one row,
hence one privacy unit unless a unit column says otherwise. For evaluation, :func:`verbaliser_choices` gives
each example's prompt and every label's response, which the model scores by log-likelihood
(:func:`hf_dpmerge.modeling.verbaliser_scoring.verbaliser_predictions`). An adapter trained without the answer's end
(``train_answer_end=False``) is scored on the verbaliser's tokens alone (``answer_end=False``): the end is a term it
never learnt.

The text is truncated (in tokens) so that prompt + the longest response fit in ``max_length``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import datasets
from transformers import PreTrainedTokenizerBase

from hf_dpmerge.data.tasks import OWN, TaskSpec
from hf_dpmerge.data.tokenize import dropped_columns

IGNORE_INDEX = -100  # the label of a token that carries no loss (transformers' and torch's convention)
_TEXT_SLOT = "\u2063TEXT\u2063"  # stands for the text while the prompt is rendered, then split around


@dataclass(frozen=True)
class InstructionFormat:
    """How a task is asked: the text's field name(s), the question, and one verbaliser per label."""

    fields: tuple[str, ...]
    question: str
    verbalisers: tuple[str, ...]


def _listed(words: Sequence[str]) -> str:
    return ", ".join(words[:-1]) + f" or {words[-1]}"


def _plain(label: str) -> str:
    return label.replace("_", " ").replace(".", " ").replace("-", " ")


_FORMATS = {
    "rotten_tomatoes": InstructionFormat(("Review",), "Is this review fresh or rotten?", ("rotten", "fresh")),
    "election_tweets": InstructionFormat(("Tweet",), "Was this tweet written by Clinton or Trump?",
                                         ("Clinton", "Trump")),
    "bbc_news": InstructionFormat(
        ("Article",), "Which section is this article from: business, entertainment, politics, sports or tech?",
        ("business", "entertainment", "politics", "sports", "tech")),
    "reuters_r8": InstructionFormat(
        ("Newswire",), "Which topic is this newswire about: acquisition, crude oil, earnings, grain, interest "
        "rates, currency, shipping or trade?",
        ("acquisition", "crude oil", "earnings", "grain", "interest rates", "currency", "shipping", "trade")),
}


def instruction_format(spec: TaskSpec) -> InstructionFormat:
    """The task's format: a hand-written one for the quickstart tasks (an own task of the same name included: never
    theirs), else "Which label fits: …?" answered by the spec's verbalisers (an own task's ``--verbalizers``) or its
    label names (``_``, ``.`` and ``-`` as spaces)."""
    if spec.is_regression:
        raise ValueError(f"{spec.name} is a regression task: a causal LM is trained on classification tasks only")
    if spec.source != OWN and spec.name in _FORMATS:
        return _FORMATS[spec.name]
    words = spec.verbalisers or tuple(_plain(label) for label in spec.label_names)
    if len(words) != spec.num_labels:
        raise ValueError(f"--verbalizers gives {len(words)} answer words for the {spec.num_labels} labels "
                         f"{','.join(spec.label_names)}: give one per label, in their order")
    if not all(word.strip() for word in words) or len(set(words)) != len(words):
        raise ValueError(f"{spec.name}: the answer words {','.join(words)} must be distinct and non-empty (one per "
                         "label): pass --verbalizers")
    fields = ("Text",) if not spec.is_pair else ("First", "Second")
    return InstructionFormat(fields, f"Which label fits: {_listed(words)}?", words)


def _content(fmt: InstructionFormat, texts: Sequence[str]) -> str:
    return "\n".join(f"{name}: {text}" for name, text in zip(fmt.fields, texts)) + f"\n{fmt.question}"


def instruction_messages(spec: TaskSpec, texts: Sequence[str]) -> list[dict[str, str]]:
    """The question about ``texts`` (one per text field, uncut) as chat messages, the way a user of a stock
    ``pipeline("text-generation")`` asks it: the prompt training renders, before its text is cut to fit."""
    return [{"role": "user", "content": _content(instruction_format(spec), texts)}]


def render_prompt(tokenizer: PreTrainedTokenizerBase, content: str) -> str:
    """A user turn ``content`` as the model is asked it: through the tokenizer's chat template (with the generation
    prompt) when it has one, else ``<content>\nAnswer: ``."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                             add_generation_prompt=True)
    return f"{content}\nAnswer: "


def _prompt_parts(tokenizer: PreTrainedTokenizerBase, fmt: InstructionFormat) -> list[str]:
    """The rendered prompt cut at each text: ``[before, between…, after]`` (one more part than fields)."""
    return render_prompt(tokenizer, _content(fmt, [_TEXT_SLOT] * len(fmt.fields))).split(_TEXT_SLOT)


def token_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def answer_end_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The tokens that end an answer: the end-of-sequence token, when the tokenizer has one."""
    return [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []


def response_ids(tokenizer: PreTrainedTokenizerBase, verbaliser: str) -> list[int]:
    """The response's tokens: the verbaliser, then the end-of-sequence token (when the tokenizer has one)."""
    return token_ids(tokenizer, verbaliser) + answer_end_ids(tokenizer)


def check_distinct_without_end(verbalisers: Sequence[str], responses: Sequence[Sequence[int]]) -> None:
    """Refuse verbalisers one of whose tokens begins another's: scored without the answer's end,
    log p(a) ≥ log p(a + more) for every model, so the longer label could never be predicted."""
    for i, shorter in enumerate(responses):
        for j, longer in enumerate(responses):
            if i != j and len(shorter) <= len(longer) and list(longer[:len(shorter)]) == list(shorter):
                raise ValueError(f"verbaliser {verbalisers[j]!r} begins with verbaliser {verbalisers[i]!r} (tokens "
                                 f"{list(shorter)}): scored without the answer's end it could never be predicted; "
                                 "train with --train_answer_end true")


class InstructionEncoder:
    """Token ids of a task's prompts and responses for one tokenizer and ``max_length``."""

    def __init__(self, spec: TaskSpec, tokenizer: PreTrainedTokenizerBase, max_length: int):
        self.spec, self.format = spec, instruction_format(spec)
        self.parts = [token_ids(tokenizer, part) for part in _prompt_parts(tokenizer, self.format)]
        self.verbaliser_tokens = [token_ids(tokenizer, word) for word in self.format.verbalisers]
        self.responses = [tokens + answer_end_ids(tokenizer) for tokens in self.verbaliser_tokens]  # as response_ids
        self.tokenizer = tokenizer
        self.text_budget = max_length - sum(map(len, self.parts)) - max(map(len, self.responses))
        if self.text_budget < len(self.format.fields):
            raise ValueError(f"--max_length {max_length} leaves no room for {spec.name}'s text after its prompt "
                             f"and answer ({max_length - self.text_budget} tokens): raise --max_length")

    def prompt(self, texts: Sequence[str]) -> list[int]:
        """The prompt's ids, each text cut to an equal share of the budget."""
        share = self.text_budget // len(texts)
        ids = list(self.parts[0])
        for text, part in zip(texts, self.parts[1:]):
            ids += token_ids(self.tokenizer, text)[:share] + part
        return ids


def tokenize_instructions(dsd, spec: TaskSpec, tokenizer: PreTrainedTokenizerBase, max_length: int = 128,
                          keep_columns: tuple[str, ...] = (), train_answer_end: bool = True):
    """Training rows (``input_ids``, ``attention_mask``, ``labels``) of every split of ``dsd``: prompt + the
    gold label's response, ``labels`` -100 on the prompt. Other columns except ``keep_columns`` are dropped.
    Pad per batch with ``DataCollatorForSeq2Seq`` (labels padded with -100).

    ``train_answer_end=False`` also labels the response's end-of-sequence token -100 (it stays in the input): the
    loss is the verbaliser's alone, so the adapter never learns to end an answer. Measured on SmolLM2, such an
    adapter's generated answers run on into further verbalisers (docs/causal-lm.md, "Ending the answer")."""
    encoder = InstructionEncoder(spec, tokenizer, max_length)
    untrained_end = not train_answer_end and tokenizer.eos_token_id is not None

    def encode(batch: dict) -> dict:
        return training_rows(((encoder.prompt([batch[column][i] for column in spec.text_columns]),
                               encoder.responses[label]) for i, label in enumerate(batch["label"])), untrained_end)

    return dsd.map(encode, batched=True, remove_columns=dropped_columns(dsd, spec, keep_columns),
                   desc=f"instructions for {spec.name}")


def training_rows(pairs, untrained_end: bool) -> dict[str, list[list[int]]]:
    """Causal-LM training columns of (prompt ids, response ids) pairs: the two joined, ``labels`` -100 on the prompt
    (and on the response's final end-of-sequence token when ``untrained_end``)."""
    rows = {"input_ids": [], "attention_mask": [], "labels": []}
    for prompt, response in pairs:
        rows["input_ids"].append(prompt + response)
        rows["attention_mask"].append([1] * (len(prompt) + len(response)))
        labels = response[:-1] + [IGNORE_INDEX] if untrained_end else response
        rows["labels"].append([IGNORE_INDEX] * len(prompt) + labels)
    return rows


def verbaliser_choices(dataset: datasets.Dataset, spec: TaskSpec, tokenizer: PreTrainedTokenizerBase,
                       max_length: int = 128, answer_end: bool = True) -> tuple[list[list[int]], list[list[int]]]:
    """(each example's prompt ids, each label's response ids) of a loaded split, for scoring. ``answer_end=False``
    drops the end-of-sequence token from every response (the prompts are unchanged): the scoring for an adapter
    trained with ``train_answer_end=False``."""
    encoder = InstructionEncoder(spec, tokenizer, max_length)
    prompts = [encoder.prompt([row[column] for column in spec.text_columns]) for row in dataset]
    if answer_end:
        return prompts, encoder.responses
    check_distinct_without_end(encoder.format.verbalisers, encoder.verbaliser_tokens)
    return prompts, encoder.verbaliser_tokens
