"""hf_dpmerge: private, mergeable LoRA fine-tuning for the Hugging Face ecosystem.

Names load lazily (PEP 562) so that ``import hf_dpmerge`` — and the mergekit start-up hook — stay cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "DPSAMConfig": "hf_dpmerge.training.dpsam_config",
    "DPSAMTrainer": "hf_dpmerge.training.dpsam_trainer",
    "PrivacyBudgetExhausted": "hf_dpmerge.training.accounting",
    "alignment_penalty": "hf_dpmerge.training.alignment",
    "PrivacyRecord": "hf_dpmerge.privacy.record",
    "PrivacyRecordError": "hf_dpmerge.privacy.record",
    "PRIVACY_RECORD_NAME": "hf_dpmerge.privacy.record",
    "base_fingerprint": "hf_dpmerge.privacy.fingerprint",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hf_dpmerge' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
