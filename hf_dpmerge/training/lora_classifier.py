"""A peft LoRA sequence classifier for a task: the base encoder, the task's own head, LoRA on the encoder.

The head (``classifier``) is trained in full as a ``modules_to_save`` copy and saved with the adapter; a base
saved with another label count gets a freshly initialised head of the task's size.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForSequenceClassification

from hf_dpmerge.data.tasks import TaskSpec


def lora_sequence_classifier(
    base: str | os.PathLike, spec: TaskSpec, *, r: int, alpha: int, target_modules: Sequence[str]
) -> PeftModel:
    """``base`` (a directory or Hub id) with ``spec``'s label space and LoRA(r, α) on ``target_modules``."""
    model = AutoModelForSequenceClassification.from_pretrained(
        base, num_labels=spec.num_labels, id2label=spec.id2label, label2id=spec.label2id,
        ignore_mismatched_sizes=True,
        problem_type="regression" if spec.is_regression else "single_label_classification",
    )
    return get_peft_model(model, LoraConfig(
        r=r, lora_alpha=alpha, target_modules=list(target_modules), modules_to_save=["classifier"], task_type="SEQ_CLS",
    ))
