"""The two models compared for a task: its own adapter on the base, and the merged encoder with its head.

- **individual** — the base with the task's adapter (LoRA + head) applied;
- **merged** — the merged encoder with the task's own head (the adapter's ``modules_to_save`` tensors) put
  in place of the merged model's head, as in the DP-Merging paper (task heads are never merged).

Both pool as their checkpoint's ``config.classifier_pooling`` says (:mod:`hf_dpmerge.modeling`).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from hf_dpmerge.data.tasks import TaskSpec
from hf_dpmerge.modeling import load_sequence_classifier
from hf_dpmerge.modeling.task_head import attach_head, task_head_state
from hf_dpmerge.utils.quiet import expected_warnings_ignored, transformers_errors_only


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device``, or CUDA when available and CPU otherwise."""
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def quiet_from_pretrained(directory: Path, spec: TaskSpec):
    """A sequence classifier from ``directory`` sized for ``spec``; a head of another size is re-created."""
    labels = {"id2label": spec.id2label, "label2id": spec.label2id} if spec.label_names else {}
    with transformers_errors_only():  # the re-created head is replaced right after
        model = load_sequence_classifier(directory, num_labels=spec.num_labels, ignore_mismatched_sizes=True, **labels)
    return model.eval()


def load_task_adapter(base_dir: str | os.PathLike, adapter_dir: str | os.PathLike, spec: TaskSpec, *,
                      trainable: bool = False):
    """The base wrapped by the task's peft adapter (LoRA and head), in eval mode.

    ``trainable`` leaves the adapter's own parameters (LoRA factors and head) requiring gradients.
    """
    from peft import PeftModel

    head = task_head_state(adapter_dir)
    model = quiet_from_pretrained(Path(base_dir), spec)
    attach_head(model, head, source=str(adapter_dir))  # checks shapes before peft does, with a clearer error
    with expected_warnings_ignored():
        return PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=trainable).eval()


def load_individual_model(base_dir: str | os.PathLike, adapter_dir: str | os.PathLike, spec: TaskSpec):
    """The base with the task's adapter (LoRA and head) applied and merged in, in eval mode."""
    return load_task_adapter(base_dir, adapter_dir, spec).merge_and_unload().eval()


def load_merged_with_head(merged_dir: str | os.PathLike, adapter_dir: str | os.PathLike, spec: TaskSpec):
    """The merged encoder with the task's own head (from the adapter's ``modules_to_save``), in eval mode."""
    model = quiet_from_pretrained(Path(merged_dir), spec)
    attach_head(model, task_head_state(adapter_dir), source=str(adapter_dir))
    return model
