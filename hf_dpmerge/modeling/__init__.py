"""Task models: sequence classifiers whose pooling is chosen by ``config.classifier_pooling``."""

from hf_dpmerge.modeling.mean_pooling import (
    CLASSIFIER_POOLING_KEY,
    MeanPoolingBertForSequenceClassification,
    load_sequence_classifier,
    masked_mean,
)

__all__ = [
    "CLASSIFIER_POOLING_KEY",
    "MeanPoolingBertForSequenceClassification",
    "load_sequence_classifier",
    "masked_mean",
]
