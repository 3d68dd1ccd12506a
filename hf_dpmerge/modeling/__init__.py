"""Task models: sequence classifiers whose pooling is chosen by ``config.classifier_pooling``, and the reader
of a task's own head. Names load lazily (PEP 562), so importing :mod:`hf_dpmerge.modeling.task_head` (the Hub
release path) does not import transformers."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "CLASSIFIER_POOLING_KEY": "hf_dpmerge.modeling.mean_pooling",
    "MeanPoolingBertForSequenceClassification": "hf_dpmerge.modeling.mean_pooling",
    "load_sequence_classifier": "hf_dpmerge.modeling.mean_pooling",
    "masked_mean": "hf_dpmerge.modeling.mean_pooling",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hf_dpmerge.modeling' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
