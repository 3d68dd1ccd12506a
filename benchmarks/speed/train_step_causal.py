"""Cost of a private causal-LM step: time and peak RSS of a DP step vs a non-private one on SmolLM2-135M.

Model: the float32 base ``examples/train_causal_lm.py`` builds (``<runs_causal>/base``, built once from the packaged
GGUF when missing), LoRA r = 8 on q_proj/v_proj; one micro-batch of ``--batch`` sequences of L tokens, labels on
the last ``ANSWER_TOKENS`` only. Arms (:data:`MODES`): the example's recipe (cached top 4 layers, the LM head at the
answer positions only, plain DP-SGD) and its non-private twin, the same k uncached, other k cached, and the earlier
default (top 15 layers uncached, dp_sat + alignment: the speed-up's reference). Time per adapter ≈ step × B/batch ×
steps. docs/causal-lm.md, ``benchmarks/reports/causal_recipe/train_step_causal.md``.

    python -m benchmarks.speed.train_step_causal [--rounds 1] [--steps 2] [--batch 16] [--length 80]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.markdown import table

from .timing import median_step_seconds, peak_rss_mb, run_arms

NON_PRIVATE = dict(dp=False, sam_mode="none", align_lambda=0.0)
PLAIN_DP = dict(sam_mode="none", align_lambda=0.0)  # the example's DP recipe: DP-SGD without SAM or alignment
# arm: (DPSAMConfig settings, LoRA layers, cached prefix)
MODES = {
    "default": (PLAIN_DP, "top_4", True),
    "default_non_private": (NON_PRIVATE, "top_4", True),
    "uncached_top_4": (PLAIN_DP, "top_4", False),
    "uncached_top_4_non_private": (NON_PRIVATE, "top_4", False),
    **{f"cached_top_{k}": (PLAIN_DP, f"top_{k}", True) for k in (2, 8)},
    "non_private": (NON_PRIVATE, "top_half", False),
    "dp_sat_align": ({}, "top_half", False),
}
REFERENCE = "dp_sat_align"  # the earlier default's DP step
NON_PRIVATE_TWIN = {"default": "default_non_private", "uncached_top_4": "uncached_top_4_non_private",
                    "dp_sat_align": "non_private"}
ANSWER_TOKENS = 3  # verbaliser + end of sequence, as in hf_dpmerge.data.instructions


def measure(mode: str, base: str, steps: int, batch: int, length: int) -> dict[str, float]:
    import tempfile

    import torch
    from datasets import Dataset

    from hf_dpmerge import DPSAMConfig
    from hf_dpmerge.training.cached_prefix import collate_prefix_rows, dp_trainer
    from hf_dpmerge.training.lora_causal_lm import lora_causal_lm

    settings, layers, cached = MODES[mode]
    torch.manual_seed(0)
    model = lora_causal_lm(base, r=8, alpha=16, target_modules=["q_proj", "v_proj"], layers=layers)
    vocab = model.config.vocab_size
    labels = torch.full((batch, length), -100)
    ids = torch.randint(1000, vocab, (batch, length))
    labels[:, -ANSWER_TOKENS:] = ids[:, -ANSWER_TOKENS:]
    data = Dataset.from_dict({"input_ids": ids.repeat(10, 1).tolist(), "labels": labels.repeat(10, 1).tolist()})
    args = DPSAMConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=batch, physical_batch_size=batch,
                       max_steps=steps + 1, report_to="none", use_cpu=True, dp_seed=0, accountant="rdp",
                       noise_multiplier=1.0, **settings)
    start = time.perf_counter()
    trainer = dp_trainer(model, args, train_dataset=data, cache_prefix="true" if cached else "false")
    setup_s = time.perf_counter() - start
    trainer.create_optimizer_and_scheduler(num_training_steps=steps + 1)
    inputs = (collate_prefix_rows([trainer.train_dataset[i] for i in range(batch)]) if cached
              else {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})
    step_s = median_step_seconds(trainer, inputs, steps)
    return {"step_s": step_s, "peak_rss_mb": peak_rss_mb(), "setup_s": setup_s}


def main() -> None:
    from hf_dpmerge.scripts.train_causal_lm import CausalScriptArguments, shared_causal_base

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs_dir", default="runs_causal", help="where the example's base is (or is built)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16, help="one micro-batch (the example's physical_batch_size)")
    parser.add_argument("--length", type=int, default=80, help="tokens per sequence (prompt + answer)")
    parser.add_argument("--example_batch", type=int, default=1600,
                        help="the example's per_device_train_batch_size")
    parser.add_argument("--example_steps", type=int, default=12, help="the example's max_steps")
    parser.add_argument("--_arm", help=argparse.SUPPRESS)
    args = parser.parse_args()
    runs_dir = Path(args.runs_dir).resolve()
    base = shared_causal_base(CausalScriptArguments(runs_dir=str(runs_dir)))
    if args._arm:
        print(json.dumps(measure(args._arm, str(base), args.steps, args.batch, args.length)))
        return
    median = run_arms(__spec__.name, list(MODES), args.rounds, ["--runs_dir", str(runs_dir), "--steps",
                                                               str(args.steps), "--batch", str(args.batch),
                                                               "--length", str(args.length)])
    micro_batches = args.example_batch / args.batch
    rows = []
    for mode, m in median.items():
        twin = median.get(NON_PRIVATE_TWIN.get(mode, ""))
        rows.append([mode, f"{m['step_s']:.2f}", f"{m['step_s'] / twin['step_s']:.2f}" if twin else "–",
                     f"{median[REFERENCE]['step_s'] / m['step_s']:.2f}", f"{m['peak_rss_mb']:.0f}",
                     f"{m['peak_rss_mb'] / twin['peak_rss_mb']:.2f}" if twin else "–", f"{m['setup_s']:.1f}",
                     f"{m['step_s'] * micro_batches * args.example_steps / 60:.1f}"])
    print(f"SmolLM2-135M, LoRA r=8 q/v; micro-batch {args.batch} × {args.length} tokens ({ANSWER_TOKENS} answer "
          f"tokens), median of {args.rounds} rounds × {args.steps} steps; cached arms: the top k layers on cached "
          "states, the LM head at the answer positions only (setup s: the cache build of the arm's 10 batches)")
    print(table(["arm", "step s", "× its non-private twin", f"speed-up over {REFERENCE}", "peak RSS MB",
                 "RSS × twin", "setup s", "adapter min"], rows))
    print(f"adapter min: {args.example_steps} steps of {args.example_batch} examples "
          f"({micro_batches:g} micro-batches each), extrapolated from the micro-batch step")


if __name__ == "__main__":
    main()
