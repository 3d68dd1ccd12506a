"""Empirical privacy audit of a training configuration: an ε lower bound from one run with canaries.

Trains one LoRA adapter on the task's training split plus random-word canaries (each included with probability
1/2), guesses which canaries were trained on and turns the correct guesses into a lower bound on ε at the claimed δ
(Steinke, Nasr & Jagielski 2023; docs/design.md §11). A bound above the claim refutes it; one below it does NOT
prove the guarantee. Every training-script flag and DPSAMConfig / TrainingArguments field is accepted, with the
same defaults (examples/train_glue.py). Example::

    hf-dpmerge audit --task bbc_news --target_epsilon 4      # --no_dp: the same run without noise
    hf-dpmerge audit --privacy_unit_column movie --canary_rows 4 --per_device_train_batch_size 16   # per film
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from hf_dpmerge.scripts.arguments import LoraArguments, TaskArguments, flags_help


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--num_canaries", type=int, default=1000, help="m, canaries drawn (default: 1000)")
    parser.add_argument("--canary_length", type=int, default=8, help="words per canary text (default: 8)")
    parser.add_argument("--canary_rows", type=int, default=1,
                        help="rows per canary: > 1 makes each canary a unit of that many rows sharing one unit id, "
                        "to audit user-level DP (needs --privacy_unit_column; default: 1)")
    parser.add_argument("--k_plus", type=int, help="'in' guesses on the highest scores (default: m/10)")
    parser.add_argument("--k_minus", type=int, help="'out' guesses on the lowest scores (default: m/10)")
    parser.add_argument("--confidence", type=float, default=0.95, help="confidence of the bound (default: 0.95)")
    parser.add_argument("--audit_seed", type=int, default=0, help="seed of the canaries and the inclusion draw")
    parser.add_argument("--output", default="audit/audit.json", help="result JSON (default: audit/audit.json)")
    parser.add_argument("--adapter_dir", help="where the audited adapter is saved (default: beside --output)")
    parser.epilog = ("task and LoRA options, as for examples/train_glue.py:\n"
                     f"{flags_help(TaskArguments, LoraArguments)}\n"
                     "other options are DPSAMConfig fields (--target_epsilon, --sam_mode, --no_dp, --max_steps, ...).")
    parser.set_defaults(accepts_extra=True)


def run(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer, HfArgumentParser, set_seed

    from hf_dpmerge.audit.audit import audit_training
    from hf_dpmerge.data import load_task
    from hf_dpmerge.training.dpsam_config import DPSAMConfig
    from hf_dpmerge.training.lora_classifier import lora_sequence_classifier
    from hf_dpmerge.training.recipe import DP_RECIPE, LORA_RECIPE

    task, lora, config_flags = HfArgumentParser((TaskArguments, LoraArguments)).parse_args_into_dataclasses(
        args=[*LORA_RECIPE, *args.extra], return_remaining_strings=True  # the released adapters' recipe first
    )
    for name, value in {"num_canaries": args.num_canaries, "canary_length": args.canary_length,
                        "canary_rows": args.canary_rows, "max_length": task.max_length, "lora_r": lora.lora_r,
                        "lora_alpha": lora.lora_alpha}.items():
        if value <= 0:
            raise ValueError(f"--{name} must be positive, got {value}")
    default_guesses = max(1, args.num_canaries // 10)
    k_plus = default_guesses if args.k_plus is None else args.k_plus
    k_minus = default_guesses if args.k_minus is None else args.k_minus
    output = Path(args.output)
    adapter_dir = Path(args.adapter_dir) if args.adapter_dir else output.with_name(output.stem + "_adapter")
    with tempfile.TemporaryDirectory(prefix="hf_dpmerge_audit_") as workdir:
        (config,) = HfArgumentParser(DPSAMConfig).parse_args_into_dataclasses(
            args=["--output_dir", workdir, *DP_RECIPE, *config_flags]
        )
        base, task = task.model_source(), task.with_pooling()
        splits, spec = load_task(task.task, max_train_samples=task.max_train_samples, path=task.dataset_path)
        tokenizer = AutoTokenizer.from_pretrained(base)
        set_seed(config.seed)
        model = lora_sequence_classifier(base, spec, classifier_pooling=task.classifier_pooling, **lora.lora_options())
        result = audit_training(
            model, tokenizer, splits["train"], spec, config,
            num_canaries=args.num_canaries, k_plus=k_plus, k_minus=k_minus, canary_length=args.canary_length,
            confidence=args.confidence, seed=args.audit_seed, max_length=task.max_length, adapter_dir=adapter_dir,
            rows_per_canary=args.canary_rows, trainer_options=lora.trainer_options(),
        )
    print(result.summary())
    print(f"saved {result.save(output)}")
    return 0
