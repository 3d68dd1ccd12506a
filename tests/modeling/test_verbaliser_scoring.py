"""Verbaliser scoring with one cached prompt pass per batch equals brute force: each (prompt, response) sequence
scored alone, unpadded."""

import numpy as np
import pytest
import torch

from hf_dpmerge.modeling.verbaliser_scoring import verbaliser_predictions, verbaliser_scores
from tests.utils.tiny_models import tiny_gpt2, tiny_llama


def brute_force_scores(model, prompts, responses) -> np.ndarray:
    scores = np.zeros((len(prompts), len(responses)))
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            for k, response in enumerate(responses):
                ids = torch.as_tensor([[*prompt, *response]])
                log_probs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
                scores[i, k] = sum(float(log_probs[len(prompt) - 1 + j, token]) for j, token in enumerate(response))
    return scores


@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt2])
@pytest.mark.parametrize("batch_size", [1, 3, 16])
def test_scores_equal_each_sequence_scored_alone(build, batch_size):
    model = build(seed=1).eval()
    generator = np.random.default_rng(0)
    prompts = [generator.integers(3, 40, size=n).tolist() for n in (5, 17, 9, 1, 12, 17, 30)]
    responses = [[7], [8, 9], [10, 11, 12]]  # responses of different lengths
    expected = brute_force_scores(model, prompts, responses)
    got = verbaliser_scores(model, prompts, responses, pad_token_id=0, batch_size=batch_size)
    np.testing.assert_allclose(got, expected, atol=1e-4)
    np.testing.assert_array_equal(verbaliser_predictions(model, prompts, responses, batch_size=batch_size),
                                  expected.argmax(axis=1))


def test_an_empty_response_is_refused():
    with pytest.raises(ValueError, match="non-empty response"):
        verbaliser_scores(tiny_llama().eval(), [[3, 4]], [[5], []])
