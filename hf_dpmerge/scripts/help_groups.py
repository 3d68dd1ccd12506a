"""The training scripts' ``--help``: their own flags in groups (task and data, privacy, LoRA and LP-FT, training,
outputs), then the other ``TrainingArguments``; the flags the DP step refuses are hidden (still refused if given)."""

from __future__ import annotations

import argparse
import dataclasses

from transformers import TrainingArguments

from hf_dpmerge.scripts.arguments import DataArguments, LoraArguments

PRIVACY = ("dp", "target_epsilon", "target_delta", "noise_multiplier", "per_sample_max_grad_norm",
           "per_device_train_batch_size", "privacy_unit_column", "accountant", "poisson_sampling", "sam_mode",
           "sam_rho", "align_lambda", "anchor_lambda", "head_phase_epsilon", "head_phase_share")
TRAINING = ("max_steps", "learning_rate", "head_learning_rate", "physical_batch_size", "lr_scheduler_type",
            "weight_decay", "seed", "use_cpu", "resume_from_checkpoint", "logging_steps", "eval_strategy", "optim")
HIDDEN = ("fp16", "bf16", "fp16_opt_level", "half_precision_backend", "bf16_full_eval", "fp16_full_eval",
          "gradient_accumulation_steps", "label_smoothing_factor", "average_tokens_across_devices",
          "torch_empty_cache_steps", "ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_static_graph",
          "max_grad_norm", "num_train_epochs")
"""Flags DPSAMTrainer's step refuses (DPSAMConfig.step_problems and its checks), or that the scripts never read
(a run is a number of steps, not epochs)."""
HELP = {"per_device_train_batch_size": "The expected Poisson batch per device (q·N): each step samples every "
                                       "privacy unit with probability q.",
        "max_eval_samples": "Score a seeded stratified subset of this size of the validation and test splits."}


def group_flags(parser: argparse.ArgumentParser, script_fields: type) -> None:
    """Regroup ``parser``'s flags (built from ``script_fields`` and DPSAMConfig) for ``--help``, the script's groups
    first (module docstring)."""
    data = {f.name for f in dataclasses.fields(DataArguments)} | {"task", "tasks", "dataset_path", "max_train_samples",
                                                                    "max_eval_samples", "model_name_or_path"}
    lora = {f.name for f in dataclasses.fields(LoraArguments)}
    script = {f.name for f in dataclasses.fields(script_fields)}
    stock = {f.name for f in dataclasses.fields(TrainingArguments)}
    titled = {"task and data": data & script, "privacy": set(PRIVACY),
              "LoRA and LP-FT": (lora | {n for n in script if n.startswith(("head_phase", "lora", "cache_prefix"))})
              - set(PRIVACY), "training": set(TRAINING),
              "outputs": script - data - lora - set(PRIVACY) - set(TRAINING)}
    titled["outputs"] -= titled["LoRA and LP-FT"]
    default = parser._action_groups[1]  # argparse's "options"
    groups = []
    for title, names in titled.items():
        group = parser.add_argument_group(title)
        moved = [action for action in default._group_actions if action.dest in names]
        group._group_actions.extend(moved)
        default._group_actions[:] = [action for action in default._group_actions if action not in moved]
        groups.append(group)
    default.title = "other flags (DPSAMConfig and transformers TrainingArguments, as transformers documents them)"
    parser._action_groups[:] = [parser._action_groups[0], *groups, default]
    parser.usage = "%(prog)s [--task TASK | --train_file FILE --label_names A,B] [flag value …]"
    for action in parser._actions:
        if action.dest in HIDDEN and action.dest in stock:
            action.help = argparse.SUPPRESS
        elif action.dest in HELP:
            action.help = HELP[action.dest] + " (default: %(default)s)"

