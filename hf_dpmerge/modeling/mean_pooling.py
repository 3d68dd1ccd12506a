"""Mean-pooling BERT sequence classifier and the loader that honours ``config.classifier_pooling``.

Sentence encoders such as all-MiniLM-L6-v2 are trained on the masked token mean

    h̄ = Σ_t m_t·h_t / Σ_t m_t        (m = attention mask, h_t = last hidden states)

and their [CLS] → pooler path is untrained for that objective. Under DP-SGD the classifier must learn from
few, noisy steps, so the head reads h̄ (``classifier_pooling = "mean"``, the field name ModernBERT uses).
The weights keep ``BertForSequenceClassification``'s names and layout (the unused pooler included), so
peft adapters, mergekit's ``base+adapter`` and the merged checkpoints stay plain BERT checkpoints; the
pooling choice travels in ``config.json`` and :func:`load_sequence_classifier` picks the class from it.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    BertConfig,
    BertForSequenceClassification,
)

from hf_dpmerge.modeling import modeling_mean_pooling_bert as remote_code
from hf_dpmerge.modeling.modeling_mean_pooling_bert import masked_mean  # noqa: F401 - exported here

CLASSIFIER_POOLING_KEY = "classifier_pooling"

class MeanPoolingBertForSequenceClassification(remote_code.MeanPoolingBertForSequenceClassification):
    """The release's mean-pooling classifier (:mod:`.modeling_mean_pooling_bert`) on a plain ``bert`` config:
    the form training, merging and evaluation use."""

    config_class = BertConfig

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        """Save as a plain ``BertForSequenceClassification`` checkpoint (same tensors, so mergekit and the Auto
        classes know it); ``config.classifier_pooling = "mean"`` records how the head pools."""
        super().save_pretrained(save_directory, *args, **kwargs)
        config = copy.deepcopy(self.config)
        config.architectures = [BertForSequenceClassification.__name__]
        config.save_pretrained(save_directory)


def default_classifier_pooling(path: str | os.PathLike) -> str:
    """The pooling a task head should read from ``path``'s encoder: ``"mean"`` for BERT encoders (sentence
    encoders are trained on h̄), ``"cls"`` for others (the mean-pooling class is BERT's only)."""
    return "mean" if AutoConfig.from_pretrained(path).model_type == "bert" else "cls"


def load_sequence_classifier(path: str | os.PathLike, **kwargs: Any) -> BertForSequenceClassification:
    """``AutoModelForSequenceClassification.from_pretrained(path, **kwargs)``, or the mean-pooling BERT class
    when ``classifier_pooling`` (a keyword, else the checkpoint's ``config.json``) is ``"mean"``.
    Other keywords are config overrides or ``from_pretrained`` options, as for the Auto class."""
    pooling = kwargs.pop(CLASSIFIER_POOLING_KEY, None)
    config_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in _CONFIG_OVERRIDES}
    config = AutoConfig.from_pretrained(path, **config_kwargs)
    pooling = pooling or getattr(config, CLASSIFIER_POOLING_KEY, "cls")
    if pooling not in ("cls", "mean"):
        raise ValueError(f"{path}: classifier_pooling must be 'cls' or 'mean', got {pooling!r}")
    setattr(config, CLASSIFIER_POOLING_KEY, pooling)
    if pooling == "cls":
        return AutoModelForSequenceClassification.from_pretrained(path, config=config, **kwargs)
    if config.model_type != "bert":
        raise ValueError(
            f"{path}: classifier_pooling='mean' is implemented for BERT encoders, not {config.model_type!r}"
        )
    return MeanPoolingBertForSequenceClassification.from_pretrained(path, config=config, **kwargs)


# config fields callers set when loading a classifier for a task
_CONFIG_OVERRIDES = ("num_labels", "id2label", "label2id", "problem_type")
