"""hf_dpmerge: private, mergeable LoRA fine-tuning for the Hugging Face ecosystem.

Names load lazily (PEP 562) so that ``import hf_dpmerge`` — and the mergekit start-up hook — stay cheap.
"""

from __future__ import annotations

from hf_dpmerge.lazy_exports import lazy_getattr

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "DPSAMConfig": "hf_dpmerge.training.dpsam_config",
    "DPSAMTrainer": "hf_dpmerge.training.dpsam_trainer",
    "PrivacyBudgetExhausted": "hf_dpmerge.training.dp.accounting",
    "alignment_penalty": "hf_dpmerge.training.alignment",
    "PrivacyRecord": "hf_dpmerge.records.record",
    "PrivacyRecordError": "hf_dpmerge.records.record",
    "PRIVACY_RECORD_NAME": "hf_dpmerge.records.record",
    "base_fingerprint": "hf_dpmerge.records.fingerprint",
    "PrivacyStatement": "hf_dpmerge.records.statement",
    "audit_training": "hf_dpmerge.audit.audit",
    "AuditResult": "hf_dpmerge.audit.audit",
    "epsilon_lower_bound": "hf_dpmerge.audit.one_run_bound",
    "TaskSpec": "hf_dpmerge.data.tasks",
    "load_task": "hf_dpmerge.data.load",
    "TaskData": "hf_dpmerge.data.load",
    "tokenize_task": "hf_dpmerge.data.tokenize",
    "compute_metrics": "hf_dpmerge.data.metrics",
    "default_model_path": "hf_dpmerge.data.model_path",
    "load_sequence_classifier": "hf_dpmerge.modeling.mean_pooling",
    "lora_sequence_classifier": "hf_dpmerge.training.lora_classifier",
    "MeanPoolingBertForSequenceClassification": "hf_dpmerge.modeling.mean_pooling",
    "evaluate_runs": "hf_dpmerge.analysis.evaluation",
    "diagnose_runs": "hf_dpmerge.analysis.diagnostics",
    "push_merged_model": "hf_dpmerge.hub.push",
    "build_model_card": "hf_dpmerge.hub.model_card",
    "train_adapter": "hf_dpmerge.scripts.train_adapter",
    "TrainedAdapter": "hf_dpmerge.scripts.train_adapter",
}

__all__ = sorted(_EXPORTS) + ["__version__"]
__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())


def __dir__() -> list[str]:
    return __all__
