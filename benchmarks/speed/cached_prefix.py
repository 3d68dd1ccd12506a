"""Examples per second of a DP step on a cached prefix against the uncached step (docs/design.md §16).

Model: the packaged all-MiniLM-L6-v2 with the default LoRA (r = 8 on query/value, A frozen, the head trained) on the
top k layers; data: the first B rows of rotten_tomatoes' training split, max_length 64, so padding is real. One step
is the whole draw of B rows in micro-batches of 64, DP-SGD with dp_sat and alignment. Arms: ``uncached_k``
(DPSAMTrainer), ``cached_k`` (CachedPrefixTrainer, float16 cache), ``cached_k_nonprivate`` and ``default`` (LoRA on
the top half, uncached), each in a fresh process, interleaved (:func:`.timing.run_arms`). ``--cache_task``: the
one-time cost instead, the cache of a whole training split. docs/benchmarks.md "DP steps on a cached prefix".

    python -m benchmarks.speed.cached_prefix [--rounds 3] [--steps 2] [--batch 256] [--layers 1,2,3]
    python -m benchmarks.speed.cached_prefix --cache_task 20newsgroups --cache_length 128 --layers 1
"""

from __future__ import annotations

import argparse
import json
import time

from benchmarks.markdown import table

from .timing import median_step_seconds, peak_rss_mb, run_arms

PHYSICAL_BATCH = 64
MAX_LENGTH = 64


def arms(layers: list[int]) -> dict[str, dict]:
    found = {"default": dict(layers="top_half", cache_prefix="false", dp=True)}
    for k in layers:
        found[f"uncached_{k}"] = dict(layers=f"top_{k}", cache_prefix="false", dp=True)
        found[f"cached_{k}"] = dict(layers=f"top_{k}", cache_prefix="true", dp=True)
    found[f"cached_{layers[0]}_nonprivate"] = dict(layers=f"top_{layers[0]}", cache_prefix="true", dp=False)
    return found


def measure(arm: dict, steps: int, batch: int) -> dict[str, float]:
    import tempfile

    import torch
    from datasets import DatasetDict
    from transformers import AutoTokenizer, DataCollatorWithPadding

    from hf_dpmerge import DPSAMConfig
    from hf_dpmerge.data import default_model_path, load_task, tokenize_task
    from hf_dpmerge.training.cached_prefix import collate_prefix_rows, dp_trainer
    from hf_dpmerge.training.lora_classifier import lora_sequence_classifier

    torch.manual_seed(0)
    splits, spec = load_task("rotten_tomatoes")
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    rows = tokenize_task(DatasetDict(train=splits["train"].select(range(batch))), spec, tokenizer,
                         max_length=MAX_LENGTH)["train"]
    model = lora_sequence_classifier(default_model_path(), spec, r=8, alpha=16, target_modules=["query", "value"],
                                     layers=arm["layers"], freeze_a=True)
    private = dict(noise_multiplier=1.0, sam_mode="dp_sat", align_lambda=0.05) if arm["dp"] else dict(
        dp=False, sam_mode="none", align_lambda=0.0)
    args = DPSAMConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=batch,
                       physical_batch_size=PHYSICAL_BATCH, max_steps=steps + 1, report_to="none", use_cpu=True,
                       dp_seed=0, accountant="rdp", **private)
    collator = DataCollatorWithPadding(tokenizer)
    start = time.perf_counter()
    trainer = dp_trainer(model, args, train_dataset=rows, data_collator=collator, cache_prefix=arm["cache_prefix"])
    build_s = time.perf_counter() - start
    trainer.create_optimizer_and_scheduler(num_training_steps=steps + 1)
    if arm["cache_prefix"] == "true":
        inputs = collate_prefix_rows([trainer.train_dataset[i] for i in range(batch)])
    else:
        inputs = collator([{k: rows[i][k] for k in ("input_ids", "attention_mask", "token_type_ids", "labels")
                            if k in rows.column_names} for i in range(batch)])
    step = median_step_seconds(trainer, inputs, steps)
    return {"examples_per_s": batch / step, "step_s": step, "setup_s": build_s, "peak_rss_mb": peak_rss_mb()}


def cache_cost(task: str, max_length: int, k: int) -> dict[str, float]:
    """Build the float16 cache of ``task``'s whole training split for LoRA on the top k layers: seconds and GiB."""
    import tempfile

    from transformers import AutoTokenizer, DataCollatorWithPadding

    from hf_dpmerge import DPSAMConfig
    from hf_dpmerge.data import default_model_path, load_task, tokenize_task
    from hf_dpmerge.training.cached_prefix import CachedPrefixTrainer
    from hf_dpmerge.training.lora_classifier import lora_sequence_classifier

    splits, spec = load_task(task)
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    rows = tokenize_task(splits, spec, tokenizer, max_length=max_length)["train"]
    model = lora_sequence_classifier(default_model_path(), spec, r=8, alpha=16, target_modules=["query", "value"],
                                     layers=f"top_{k}", freeze_a=True)
    args = DPSAMConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=256, max_steps=1, report_to="none",
                       use_cpu=True, noise_multiplier=1.0, per_device_eval_batch_size=128)
    start = time.perf_counter()
    trainer = CachedPrefixTrainer(model=model, args=args, train_dataset=rows, data_collator=DataCollatorWithPadding(
        tokenizer))
    seconds = time.perf_counter() - start
    table = trainer.train_dataset
    size = table.states.numel() * table.states.element_size() + table.offsets.numel() * 8
    return {"rows": len(table), "tokens": int(table.offsets[-1]), "build_s": seconds, "gib": size / 2**30,
            "peak_rss_mb": peak_rss_mb()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--layers", default="1,2,3", help="the k values compared (default: 1,2,3)")
    parser.add_argument("--cache_task", help="measure the cache of this task's whole training split instead")
    parser.add_argument("--cache_length", type=int, default=128, help="max_length of --cache_task (default: 128)")
    parser.add_argument("--_arm", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cache_task:
        for k in (int(k) for k in args.layers.split(",")):
            cost = cache_cost(args.cache_task, args.cache_length, k)
            print(f"{args.cache_task} (max_length {args.cache_length}), k = {k}: {cost['rows']} rows, "
                  f"{cost['tokens']} tokens, cache {cost['gib']:.2f} GiB (float16) built in {cost['build_s']:.0f} s, "
                  f"peak RSS {cost['peak_rss_mb']:.0f} MB")
        return
    arms_by_name = arms([int(k) for k in args.layers.split(",")])
    if args._arm:
        print(json.dumps(measure(arms_by_name[args._arm], args.steps, args.batch)))
        return
    median = run_arms(__spec__.name, list(arms_by_name), args.rounds,
                      ["--steps", str(args.steps), "--batch", str(args.batch), "--layers", args.layers])
    default = median["default"]["examples_per_s"]
    print(f"MiniLM, {args.batch} rows of rotten_tomatoes (max_length {MAX_LENGTH}) per step in micro-batches of "
          f"{PHYSICAL_BATCH}; median of {args.rounds} rounds × {args.steps} steps")
    rows = []
    for name, m in median.items():
        same = median.get(f"uncached_{name.split('_')[1]}") if name.startswith("cached") else None
        rows.append([name, f"{m['examples_per_s']:.1f}", f"{m['examples_per_s'] / same['examples_per_s']:.2f}"
                     if same else "–", f"{m['examples_per_s'] / default:.2f}", f"{m['setup_s']:.1f}",
                     f"{m['peak_rss_mb']:.0f}"])
    print(table(["arm", "examples/s", "× uncached same k", "× default", "setup s (cache build)", "peak RSS MB"], rows))


if __name__ == "__main__":
    main()
