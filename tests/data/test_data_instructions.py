"""Tasks written as instructions: one distinct verbaliser per label, regression refused, the answer always fits."""

from dataclasses import replace

import pytest
from datasets import Dataset

from hf_dpmerge.data.instructions import (
    InstructionEncoder,
    check_distinct_without_end,
    instruction_format,
    tokenize_instructions,
    verbaliser_choices,
)
from hf_dpmerge.data.tasks import OWN, TASKS, TaskSpec, get_task_spec
from tests.utils.tiny_models import tiny_causal_tokenizer


@pytest.mark.parametrize("name", [name for name, spec in TASKS.items() if not spec.is_regression])
def test_every_classification_task_has_one_distinct_verbaliser_per_label(name):
    spec = get_task_spec(name)
    verbalisers = instruction_format(spec).verbalisers
    assert len(verbalisers) == spec.num_labels and len(set(verbalisers)) == spec.num_labels


def test_a_regression_task_is_refused():
    with pytest.raises(ValueError, match="stsb is a regression task"):
        instruction_format(get_task_spec("stsb"))


def test_an_own_task_is_asked_with_its_verbalisers_or_label_names_never_a_packaged_tasks_format():
    own = TaskSpec("rotten_tomatoes", 2, ("neg", "pos_note"), ("text",), "accuracy", OWN)
    assert instruction_format(own).verbalisers == ("neg", "pos note")  # the label names, as for GLUE tasks
    assert instruction_format(own).question == "Which label fits: neg or pos note?"
    answered = instruction_format(replace(own, verbalisers=("rotten", "fresh")))
    assert answered.verbalisers == ("rotten", "fresh") and answered.question == "Which label fits: rotten or fresh?"
    with pytest.raises(ValueError, match="--verbalizers gives 3 answer words for the 2 labels neg,pos_note"):
        instruction_format(replace(own, verbalisers=("a", "b", "c")))
    with pytest.raises(ValueError, match="must be distinct and non-empty"):
        instruction_format(replace(own, verbalisers=("yes", "yes")))


def test_a_max_length_without_room_for_the_text_is_refused_naming_the_flag():
    with pytest.raises(ValueError, match="raise --max_length"):
        InstructionEncoder(get_task_spec("rotten_tomatoes"), tiny_causal_tokenizer(), max_length=12)


def test_sentence_pairs_share_the_text_budget_and_keep_both_texts():
    tokenizer = tiny_causal_tokenizer()
    spec = get_task_spec("mrpc")
    first, second = " ".join(["the film was a delight"] * 20), " ".join(["markets rallied"] * 40)
    rows = tokenize_instructions(Dataset.from_dict({"sentence1": [first], "sentence2": [second], "label": [1]}),
                                 spec, tokenizer, max_length=40)
    ids = rows[0]["input_ids"]
    assert len(ids) <= 40
    assert tokenizer.convert_tokens_to_ids("delight") in ids and tokenizer.convert_tokens_to_ids("markets") in ids


def test_scoring_without_the_answers_end_drops_only_the_end_of_sequence_token():
    tokenizer = tiny_causal_tokenizer()
    spec = get_task_spec("rotten_tomatoes")
    rows = Dataset.from_dict({"text": ["a fine film", "a dull one"], "label": [1, 0]})
    prompts, responses = verbaliser_choices(rows, spec, tokenizer, max_length=40)
    same_prompts, verbalisers = verbaliser_choices(rows, spec, tokenizer, max_length=40, answer_end=False)
    assert same_prompts == prompts  # the prompt (and its text's truncation) does not depend on the scoring
    assert all(r[-1] == tokenizer.eos_token_id for r in responses)
    assert verbalisers == [r[:-1] for r in responses]


def test_verbalisers_whose_tokens_begin_another_are_refused_without_the_answers_end():
    with pytest.raises(ValueError, match=r"'positive!' begins with verbaliser 'positive'.*--train_answer_end true"):
        check_distinct_without_end(["positive", "positive!"], [[5, 6], [5, 6, 7]])
    check_distinct_without_end(["yes", "no"], [[5, 6], [5, 7]])  # a shared first token is fine

