"""The mean-pooling classifier: padding-invariant masked mean, plain-BERT checkpoints, loader dispatch."""

import json

import pytest
import torch
from transformers import AutoModelForSequenceClassification, BertForSequenceClassification, GPT2Config

from hf_dpmerge.modeling import (
    MeanPoolingBertForSequenceClassification,
    default_classifier_pooling,
    load_sequence_classifier,
    masked_mean,
)
from tests.utils.tiny_models import tiny_bert, tiny_tokenizer


@pytest.fixture
def saved_base(tmp_path):
    tiny_bert().save_pretrained(tmp_path / "base")
    return tmp_path / "base"


def test_logits_are_the_classifier_of_the_masked_token_mean(saved_base):
    model = load_sequence_classifier(saved_base, classifier_pooling="mean").eval()
    batch = tiny_tokenizer()(["the film was a delight", "a dull script"], padding=True, return_tensors="pt")
    hidden = model.bert(**batch).last_hidden_state
    mask = batch["attention_mask"]
    expected = torch.stack([
        model.classifier(hidden[i, mask[i].bool()].mean(dim=0)) for i in range(len(mask))
    ])
    torch.testing.assert_close(model(**batch).logits, expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(masked_mean(hidden, mask), hidden.mean(dim=1))  # padding really is excluded


def test_padding_does_not_change_the_prediction(saved_base):
    model = load_sequence_classifier(saved_base, classifier_pooling="mean").eval()
    tok = tiny_tokenizer()
    alone = model(**tok(["a dull script"], return_tensors="pt")).logits
    padded = model(**tok(["a dull script", "the film was a delight from start to finish"], padding=True,
                         return_tensors="pt")).logits[:1]
    torch.testing.assert_close(alone, padded, rtol=1e-5, atol=1e-6)


def test_loss_matches_cross_entropy_and_mse(saved_base):
    batch = tiny_tokenizer()(["the film was a delight", "a dull script"], padding=True, return_tensors="pt")
    model = load_sequence_classifier(saved_base, classifier_pooling="mean", num_labels=3,
                                     ignore_mismatched_sizes=True).eval()
    labels = torch.tensor([2, 0])
    out = model(**batch, labels=labels)
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits, labels))
    regressor = load_sequence_classifier(saved_base, classifier_pooling="mean", num_labels=1,
                                         ignore_mismatched_sizes=True,
                                         problem_type="regression").eval()
    target = torch.tensor([0.3, -1.0])
    out = regressor(**batch, labels=target)
    torch.testing.assert_close(out.loss, torch.nn.functional.mse_loss(out.logits.squeeze(-1), target))


def test_saved_checkpoint_is_plain_bert_with_the_pooling_recorded(saved_base, tmp_path):
    model = load_sequence_classifier(saved_base, classifier_pooling="mean")
    model.save_pretrained(tmp_path / "mean")
    config = json.loads((tmp_path / "mean" / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["classifier_pooling"] == "mean"
    assert type(load_sequence_classifier(tmp_path / "mean")) is MeanPoolingBertForSequenceClassification
    plain = AutoModelForSequenceClassification.from_pretrained(tmp_path / "mean")
    assert type(plain) is BertForSequenceClassification  # same tensors: mergekit and peft see plain BERT
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(plain.state_dict()[name], tensor)


def test_cls_is_the_default_and_bad_choices_are_refused(saved_base, tmp_path):
    assert type(load_sequence_classifier(saved_base)) is BertForSequenceClassification
    with pytest.raises(ValueError, match="classifier_pooling must be 'cls' or 'mean'"):
        load_sequence_classifier(saved_base, classifier_pooling="max")
    GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=20).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match="implemented for BERT encoders, not 'gpt2'"):
        load_sequence_classifier(tmp_path / "gpt2", classifier_pooling="mean")


def test_default_pooling_is_mean_for_bert_encoders_only(saved_base, tmp_path):
    assert default_classifier_pooling(saved_base) == "mean"
    GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=20).save_pretrained(tmp_path / "gpt2")
    assert default_classifier_pooling(tmp_path / "gpt2") == "cls"
