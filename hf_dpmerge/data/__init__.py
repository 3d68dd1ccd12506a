"""Tasks, offline datasets, splits, tokenization and metrics.

Names load lazily (PEP 562): ``import hf_dpmerge.data`` does not import ``datasets`` or ``transformers``.
"""

from __future__ import annotations

from hf_dpmerge.lazy_exports import lazy_getattr

_EXPORTS: dict[str, str] = {
    "TaskSpec": "hf_dpmerge.data.tasks",
    "TASKS": "hf_dpmerge.data.tasks",
    "PACKAGED_TASKS": "hf_dpmerge.data.tasks",
    "GLUE_TASKS": "hf_dpmerge.data.tasks",
    "DEFAULT_TASK": "hf_dpmerge.data.tasks",
    "get_task_spec": "hf_dpmerge.data.tasks",
    "load_task": "hf_dpmerge.data.load",
    "TaskData": "hf_dpmerge.data.load",
    "DEFAULT_SPLIT_SEED": "hf_dpmerge.data.load",
    "tokenize_task": "hf_dpmerge.data.tokenize",
    "compute_metrics": "hf_dpmerge.data.metrics",
    "trainer_compute_metrics": "hf_dpmerge.data.metrics",
    "predictions_from_logits": "hf_dpmerge.data.metrics",
    "default_model_path": "hf_dpmerge.data.model_path",
    "MissingAssetPackage": "hf_dpmerge.data.packaged",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())
