"""A peft LoRA sequence classifier for a task: the base encoder, the task's own head, LoRA on the encoder.

The head (``classifier``) is trained in full as a ``modules_to_save`` copy and saved with the adapter; a base
saved with another label count gets a freshly initialised head of the task's size. The head pools as the
base's ``config.classifier_pooling`` says (see :mod:`hf_dpmerge.modeling.mean_pooling`) unless told otherwise.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence

import torch
from peft import LoraConfig, PeftModel, get_peft_model

from hf_dpmerge.data.tasks import TaskSpec
from hf_dpmerge.modeling import load_sequence_classifier
from hf_dpmerge.training.shared_lora_a import DEFAULT_LORA_A_SEED, freeze_shared_lora_a
from hf_dpmerge.utils.quiet import expected_warnings_ignored, transformers_errors_only


def lora_layer_indices(choice: str, num_layers: int) -> list[int] | None:
    """The layers given LoRA: None (= all) for 'all', the upper ⌈L/2⌉ for 'top_half', the upper K for 'top_K', else
    the listed indices."""
    if choice == "all":
        return None
    if choice == "top_half":
        return list(range(num_layers // 2, num_layers))
    if choice.startswith("top_"):
        count = choice.removeprefix("top_")
        if not count.isdigit() or not 1 <= int(count) <= num_layers:
            raise ValueError(f"LoRA layers {choice!r}: top_K needs 1 ≤ K ≤ {num_layers} (the model's layers)")
        return list(range(num_layers - int(count), num_layers))
    try:
        layers = [int(i) for i in choice.split(",")]
    except ValueError:
        raise ValueError(f"LoRA layers {choice!r}: give 'all', 'top_half', 'top_K' or comma-separated "
                         "indices") from None
    if any(not 0 <= i < num_layers for i in layers):
        raise ValueError(f"LoRA layers {choice!r}: indices must lie in [0, {num_layers})")
    return layers


def check_target_modules(model: torch.nn.Module, target_modules: Sequence[str]) -> None:
    """Refuse a ``--lora_target_modules`` name that matches no module of ``model`` (peft matches a name ``t`` to
    modules named ``t`` or ending in ``.t``, and trains silently when only some names match), listing the
    names LoRA can target (the model's linear layers)."""
    names = [name for name, _ in model.named_modules() if name]
    unmatched = [t for t in target_modules if not any(n == t or n.endswith(f".{t}") for n in names)]
    if unmatched:
        linear = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                         if isinstance(module, torch.nn.Linear)})
        hints = [f"{t!r}" + (f" (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(t, linear, 1))
                             else "") for t in unmatched]
        raise ValueError(f"--lora_target_modules: {', '.join(hints)} match no module of the model; its linear "
                         f"layers are {linear}")


def lora_sequence_classifier(
    base: str | os.PathLike,
    spec: TaskSpec,
    *,
    r: int,
    alpha: int,
    target_modules: Sequence[str],
    layers: str = "all",
    classifier_pooling: str | None = None,
    train_lora: bool = True,
    freeze_a: bool = False,
    a_seed: int = DEFAULT_LORA_A_SEED,
) -> PeftModel:
    """``base`` (a directory or Hub id) with ``spec``'s label space and LoRA(r, α) on ``target_modules`` of
    ``layers`` ('all', 'top_half' or indices; see :func:`lora_layer_indices`). ``train_lora=False`` freezes the
    LoRA factors at their initialisation (B = 0, so ΔW = 0): only the head trains, the "base encoder + own head"
    floor of a benchmark. ``freeze_a`` draws every A from the public ``a_seed`` and freezes it, so only B and the
    head train (FFA-LoRA; :mod:`hf_dpmerge.training.shared_lora_a`)."""
    pooling = {"classifier_pooling": classifier_pooling} if classifier_pooling else {}
    with transformers_errors_only():  # the task's head is new: its "missing" load report is expected
        model = load_sequence_classifier(
            base, num_labels=spec.num_labels, id2label=spec.id2label, label2id=spec.label2id,
            ignore_mismatched_sizes=True,
            problem_type="regression" if spec.is_regression else "single_label_classification", **pooling,
        )
    check_target_modules(model, target_modules)
    with expected_warnings_ignored():
        model = get_peft_model(model, LoraConfig(
            r=r, lora_alpha=alpha, target_modules=list(target_modules), modules_to_save=["classifier"],
            layers_to_transform=lora_layer_indices(layers, model.config.num_hidden_layers), task_type="SEQ_CLS",
        ))
    if freeze_a:
        freeze_shared_lora_a(model, a_seed)
    if not train_lora:
        for name, parameter in model.named_parameters():
            if ".lora_" in name:
                parameter.requires_grad_(False)
    return model
