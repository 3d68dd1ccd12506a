"""Completion token accuracy against a brute force: each row alone, unpadded, token by token."""

from __future__ import annotations

import torch

from hf_dpmerge.data.completions import CompletionEncoder, completion_rows
from hf_dpmerge.modeling.completion_scoring import completion_token_accuracy
from tests.utils.tiny_models import CORPUS, tiny_causal_tokenizer, tiny_llama


def brute_force(model, rows) -> float:
    correct = total = 0
    for prompt, response in rows:
        for j, token in enumerate(response):
            prefix = torch.as_tensor([[*prompt, *response[:j]]])
            correct += int(model(input_ids=prefix).logits[0, -1].argmax()) == token
            total += 1
    return correct / total


@torch.inference_mode()
def test_batched_right_padded_scoring_matches_each_row_scored_alone() -> None:
    model, tokenizer = tiny_llama(seed=1, initializer_range=0.5).eval(), tiny_causal_tokenizer()
    dataset = [{"prompt": " ".join(CORPUS[i:i + 1 + i % 3]), "completion": CORPUS[i + 1]} for i in range(5)]
    rows = []
    for prompt, response in completion_rows(dataset, tokenizer, max_length=32):
        greedy = list(prompt)
        for _ in range(2):  # two tokens the model predicts, then the row's own (mostly not)
            greedy.append(int(model(input_ids=torch.as_tensor([greedy])).logits[0, -1].argmax()))
        rows.append((prompt, greedy[len(prompt):] + response))
    assert len({len(p) + len(r) for p, r in rows}) > 1  # rows of several lengths: padding is exercised
    expected = brute_force(model, rows)
    assert completion_token_accuracy(model, rows, batch_size=3) == expected
    assert 0 < expected < 1


def test_a_long_completion_keeps_half_the_length_and_ends_with_the_end_token() -> None:
    tokenizer = tiny_causal_tokenizer()
    prompt, response = CompletionEncoder(tokenizer, max_length=24).row(" ".join(CORPUS), " ".join(CORPUS * 3))
    assert len(prompt) + len(response) <= 24 and len(response) == 24 // 2 + 1
    assert response[-1] == tokenizer.eos_token_id
