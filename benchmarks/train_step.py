"""Step time and peak RSS of DPSAMTrainer's modes on one model and batch, as ratios to non-private.

Each measurement runs in a fresh subprocess (so peak RSS is that mode's own), and the modes are
interleaved round by round so machine load affects them alike. Model: the packaged all-MiniLM-L6-v2
(22.7M params) with LoRA r=8 on query/value + the classifier head; batch of B sentences of L tokens.

    python benchmarks/train_step.py [--rounds 3] [--steps 4] [--batch 64] [--length 64]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

MODES = {
    "non_private": dict(dp=False, sam_mode="none", align_lambda=0.0),
    "dp_sgd": dict(sam_mode="none", align_lambda=0.0),
    "dp_sat": dict(sam_mode="dp_sat", align_lambda=0.05),
    "per_example": dict(sam_mode="per_example", align_lambda=0.05),
    "two_query": dict(sam_mode="two_query", align_lambda=0.05),
}


def median_step_seconds(trainer, inputs: dict, steps: int) -> float:
    """The median wall time of ``steps`` optimizer steps on ``inputs`` (training step, optimizer step, zeroed
    gradients), after one untimed step that warms up (and gives dp_sat its previous gradient)."""
    times = []
    for i in range(steps + 1):
        start = time.perf_counter()
        trainer.training_step(trainer.model, inputs)
        trainer.optimizer.step()
        trainer.model.zero_grad()
        if i:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


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
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"step_s": median_step_seconds(trainer, inputs, steps), "peak_rss_mb": peak_rss_mb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--_mode", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._mode:
        print(json.dumps(measure(args._mode, args.steps, args.batch, args.length)))
        return
    results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for round_index in range(args.rounds):
        for mode in MODES:
            out = subprocess.run(
                [sys.executable, __file__, "--_mode", mode, "--steps", str(args.steps),
                 "--batch", str(args.batch), "--length", str(args.length)],
                check=True, capture_output=True, text=True,
            ).stdout.strip().splitlines()[-1]
            results[mode].append(json.loads(out))
            print(f"round {round_index + 1}/{args.rounds} {mode}: {results[mode][-1]}", file=sys.stderr)
    base_time = statistics.median(r["step_s"] for r in results["non_private"])
    base_rss = statistics.median(r["peak_rss_mb"] for r in results["non_private"])
    print(f"batch {args.batch} × {args.length} tokens, median of {args.rounds} rounds × {args.steps} steps")
    print(f"{'mode':<12} {'step s':>8} {'time ×':>7} {'peak RSS MB':>12} {'RSS ×':>6}")
    for mode, runs in results.items():
        step = statistics.median(r["step_s"] for r in runs)
        rss = statistics.median(r["peak_rss_mb"] for r in runs)
        print(f"{mode:<12} {step:>8.3f} {step / base_time:>7.2f} {rss:>12.0f} {rss / base_rss:>6.2f}")


if __name__ == "__main__":
    main()
