"""Task models: sequence classifiers whose pooling is chosen by ``config.classifier_pooling``, and the reader
of a task's own head. Names load lazily (PEP 562), so importing :mod:`hf_dpmerge.modeling.task_head` (the Hub
release path) does not import transformers."""

from __future__ import annotations

from hf_dpmerge.lazy_exports import lazy_getattr

_EXPORTS: dict[str, str] = {
    "CLASSIFIER_POOLING_KEY": "hf_dpmerge.modeling.mean_pooling",
    "default_classifier_pooling": "hf_dpmerge.modeling.mean_pooling",
    "MeanPoolingBertForSequenceClassification": "hf_dpmerge.modeling.mean_pooling",
    "load_sequence_classifier": "hf_dpmerge.modeling.mean_pooling",
    "masked_mean": "hf_dpmerge.modeling.mean_pooling",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())


def __dir__() -> list[str]:
    return __all__
