"""Step time and peak RSS of DPSAMTrainer's modes on one model and batch, as ratios to non-private.

Model: the packaged all-MiniLM-L6-v2 (22.7M params) with LoRA r=8 on query/value + the classifier head; batch of B
sentences of L tokens; each mode in a fresh process, interleaved (:func:`.timing.run_arms`). docs/benchmarks.md
"Speed and memory".

    python -m benchmarks.speed.train_step [--rounds 3] [--steps 4] [--batch 64] [--length 64]
"""

from __future__ import annotations

import argparse
import json

from benchmarks.markdown import table

from .timing import median_step_seconds, peak_rss_mb, run_arms

MODES = {
    "non_private": dict(dp=False, sam_mode="none", align_lambda=0.0),
    "dp_sgd": dict(sam_mode="none", align_lambda=0.0),
    "dp_sat": dict(sam_mode="dp_sat", align_lambda=0.05),
    "per_example": dict(sam_mode="per_example", align_lambda=0.05),
    "two_query": dict(sam_mode="two_query", align_lambda=0.05),
}


def measure(mode: str, steps: int, batch: int, length: int) -> dict[str, float]:
    import tempfile

    import torch
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSequenceClassification

    from hf_dpmerge import DPSAMConfig, DPSAMTrainer
    from hf_dpmerge.data import default_model_path

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(default_model_path(), num_labels=2)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["query", "value"],
                                             modules_to_save=["classifier"], task_type="SEQ_CLS"))
    vocab = model.config.vocab_size
    data = Dataset.from_dict({"input_ids": torch.randint(1000, vocab, (batch * 10, length)).tolist(),
                              "label": [i % 2 for i in range(batch * 10)]})
    args = DPSAMConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=batch, physical_batch_size=batch,
                       max_steps=steps + 1, report_to="none", use_cpu=True, dp_seed=0, accountant="rdp",
                       noise_multiplier=1.0, **MODES[mode])
    trainer = DPSAMTrainer(model=model, args=args, train_dataset=data)
    trainer.create_optimizer_and_scheduler(num_training_steps=steps + 1)
    inputs = {"input_ids": torch.randint(1000, vocab, (batch, length)),
              "attention_mask": torch.ones(batch, length, dtype=torch.long),
              "labels": torch.randint(0, 2, (batch,))}
    peak = peak_rss_mb()
    return {"step_s": median_step_seconds(trainer, inputs, steps), "peak_rss_mb": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--_arm", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._arm:
        print(json.dumps(measure(args._arm, args.steps, args.batch, args.length)))
        return
    median = run_arms(__spec__.name, list(MODES), args.rounds,
                      ["--steps", str(args.steps), "--batch", str(args.batch), "--length", str(args.length)])
    base = median["non_private"]
    print(f"batch {args.batch} × {args.length} tokens, median of {args.rounds} rounds × {args.steps} steps")
    print(table(["mode", "step s", "time ×", "peak RSS MB", "RSS ×"],
                [[mode, f"{m['step_s']:.3f}", f"{m['step_s'] / base['step_s']:.2f}", f"{m['peak_rss_mb']:.0f}",
                  f"{m['peak_rss_mb'] / base['peak_rss_mb']:.2f}"] for mode, m in median.items()]))


if __name__ == "__main__":
    main()
