"""A factor-space merge of shared-A adapters (``--as-adapter``) against the dense merge: time and size.

Inputs built from a config (no downloads): a MiniLM-sized BERT encoder (random weights) and four encoder adapters
(LoRA r=8 on query/value, A frozen from one public seed as ``--lora_freeze_a`` draws it, random B, each with a
privacy record stating its ``lora_a``). Both paths run the same ``task_arithmetic`` YAML as an ``hf-dpmerge merge``
process, interleaved: dense with an empty ``--lora-merge-cache``, factor-space with ``--as-adapter``. Printed: median
wall time, the weights file's and the whole output's size, their ratios, and the in-process time of
:func:`~hf_dpmerge.merging.adapters.adapter_merge.merge_shared_a_adapters`. docs/merging.md.

    python -m benchmarks.speed.factor_merge [--workdir DIR] [--repeats N]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import BertConfig, BertForSequenceClassification

from hf_dpmerge.merging.adapters.adapter_merge import merge_shared_a_adapters
from hf_dpmerge.records.fingerprint import base_fingerprint, peft_base_tensors
from hf_dpmerge.training.encoder_adapter import export_encoder_adapter
from hf_dpmerge.training.shared_lora_a import freeze_shared_lora_a, frozen_lora_a_record

from .timing import synthetic_record, timed_process

ADAPTERS = 4


def build_inputs(workdir: Path) -> Path:
    """Save the base and the adapters under ``workdir`` (once); returns the merge YAML."""
    config_path = workdir / "merge.yaml"
    if config_path.exists():
        return config_path
    config = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(workdir / "base")
    models = ""
    for index in range(ADAPTERS):
        torch.manual_seed(0)
        model = get_peft_model(BertForSequenceClassification(config), LoraConfig(
            r=8, lora_alpha=16, target_modules=["query", "value"], modules_to_save=["classifier"],
            task_type="SEQ_CLS"))
        freeze_shared_lora_a(model)
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if ".lora_B." in name:
                    parameter.normal_(0, 0.01)
        adapter = workdir / f"task{index}" / "adapter"
        model.save_pretrained(adapter)
        tensors = peft_base_tensors(model)
        synthetic_record("minilm-sized", base_fingerprint(tensors), sorted(tensors),
                         lora_a=frozen_lora_a_record(model)).save(adapter)
        export_encoder_adapter(adapter, workdir / f"task{index}" / "encoder_adapter")
        models += f"  - model: {workdir / 'base'}+{workdir / f'task{index}' / 'encoder_adapter'}\n"
        models += "    parameters:\n      weight: 1.0\n"
    config_path.write_text(
        f"merge_method: task_arithmetic\nbase_model: {workdir / 'base'}\nmodels:\n{models}"
        "parameters:\n  lambda: 0.3\ndtype: float32\n"
    )
    return config_path


def _size(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


def run_once(config: Path, out: Path, as_adapter: bool, cache: Path) -> float:
    """Wall seconds of one ``hf-dpmerge merge`` process (output and cache removed first)."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    options = ["--as-adapter"] if as_adapter else ["--lora-merge-cache", str(cache)]
    return timed_process([sys.executable, "-m", "hf_dpmerge.cli.main", "merge", str(config), str(out), *options])[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("benchmark_factor_merge"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    config = build_inputs(args.workdir)
    paths = {"dense": False, "adapter": True}
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.repeats):  # interleaved, so load changes hit both paths alike
        for name, as_adapter in paths.items():
            times[name].append(run_once(config, args.workdir / f"out-{name}", as_adapter, args.workdir / "cache"))
    sizes = {name: _size(args.workdir / f"out-{name}") for name in paths}
    weights = {name: (args.workdir / f"out-{name}" / file).stat().st_size
               for name, file in (("dense", "model.safetensors"), ("adapter", "adapter_model.safetensors"))}
    for name in paths:
        print(f"{name:8} median {statistics.median(times[name]):7.2f} s   weights {weights[name] / 2**20:8.2f} MiB   "
              f"output {sizes[name] / 2**20:8.2f} MiB")
    print(f"adapter/dense: time {statistics.median(times['adapter']) / statistics.median(times['dense']):.3f}×, "
          f"weights {weights['adapter'] / weights['dense']:.4f}×, output {sizes['adapter'] / sizes['dense']:.4f}×")
    adapters = [args.workdir / f"task{index}" / "encoder_adapter" for index in range(ADAPTERS)]
    start = time.perf_counter()
    merge_shared_a_adapters(adapters, args.workdir / "out-in-process", lam=0.3, overwrite=True)
    print(f"merge_shared_a_adapters in process: {time.perf_counter() - start:.3f} s")


if __name__ == "__main__":
    main()
