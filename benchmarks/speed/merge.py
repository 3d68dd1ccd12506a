"""mergekit ``ties`` and ``task_arithmetic`` against ``cauchy_poe`` and ``dp_aware``: wall time and peak RSS.

Inputs built from a config (no downloads): a BERT-base-sized classifier (~110M parameters, random weights), four
LoRA adapters (r=8 on query/value, each with a privacy record) merged as ``base+adapter`` (``lora``), four and eight
full-model variants (base + 1e-3 noise: ``full``, ``full8``). Each merge is one ``mergekit-yaml`` process, method
order rotating per repeat, the LoRA merge cache warmed first; printed as ratios to ties. ``--num-threads`` passes
mergekit's (on a shared machine torch's OpenMP threads wait at barriers). docs/benchmarks.md "Speed and memory".

    python -m benchmarks.speed.merge [--workdir DIR] [--repeats N] [--kinds lora full full8] [--methods ...]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import BertConfig, BertForSequenceClassification

from benchmarks.markdown import table
from hf_dpmerge.merging.merge_config import lora_reference, merge_config_yaml, mergekit_config
from hf_dpmerge.records.fingerprint import base_fingerprint, peft_base_tensors

from .timing import synthetic_record, timed_process

METHODS: dict[str, dict[str, float]] = {
    "ties": {"weight": 1.0, "density": 0.2},
    "task_arithmetic": {"weight": 1.0, "lambda": 0.3},
    "cauchy_poe": {"lambda": 1.0, "tol": 0.01},
    "dp_aware": {"lambda": 0.3},
}
ADAPTERS = 4
VARIANTS = 8
KINDS = {"lora": ADAPTERS, "full": ADAPTERS, "full8": VARIANTS}


def build_inputs(workdir: Path) -> None:
    """Save the base, the LoRA adapters and the full-model variants under ``workdir`` (once)."""
    if (workdir / "done-8").exists():  # built with VARIANTS full models
        return
    torch.manual_seed(0)
    base = BertForSequenceClassification(BertConfig(num_labels=2))
    base.save_pretrained(workdir / "base")
    for index in range(ADAPTERS):
        torch.manual_seed(100 + index)
        model = get_peft_model(BertForSequenceClassification.from_pretrained(workdir / "base"),
                               LoraConfig(r=8, lora_alpha=16, target_modules=["query", "value"],
                                          init_lora_weights=False))
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "lora_" in name:
                    parameter.mul_(0.05)
        tensors = peft_base_tensors(model)
        model.save_pretrained(workdir / f"adapter{index}")
        record = synthetic_record("bert-base-sized", base_fingerprint(tensors), sorted(tensors))
        record.save(workdir / f"adapter{index}")
    hashed = ["bert.encoder.layer.0.attention.self.query.weight"]
    base_hash = base_fingerprint({name: base.state_dict()[name] for name in hashed})
    for index in range(VARIANTS):
        variant = BertForSequenceClassification.from_pretrained(workdir / "base")
        generator = torch.Generator().manual_seed(200 + index)
        with torch.no_grad():
            for parameter in variant.parameters():
                parameter.add_(1e-3 * torch.randn(parameter.shape, generator=generator))
        variant.save_pretrained(workdir / f"full{index}")
        synthetic_record("bert-base-sized", base_hash, hashed).save(workdir / f"full{index}")
    (workdir / "done-8").touch()


def _config(workdir: Path, method: str, kind: str) -> Path:
    base = workdir / "base"
    inputs = [lora_reference(base, workdir / f"adapter{i}") if kind == "lora" else str(workdir / f"full{i}")
              for i in range(KINDS[kind])]
    path = workdir / f"{kind}_{method}.yaml"
    path.write_text(merge_config_yaml(mergekit_config(method, base, inputs, parameters=METHODS[method])))
    return path


def run_once(workdir: Path, method: str, kind: str, cuda: bool = False,
             threads: int | None = None) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one ``mergekit-yaml`` process."""
    out = workdir / f"out_{kind}_{method}"
    shutil.rmtree(out, ignore_errors=True)
    return timed_process([str(Path(sys.executable).with_name("mergekit-yaml")), str(_config(workdir, method, kind)),
                          str(out), "--lora-merge-cache", str(workdir / "lora_cache"), "--quiet",
                          "--no-write-model-card", *(["--cuda"] if cuda else []),
                          *(["--num-threads", str(threads)] if threads else [])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("runs/bench_merge"))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--kinds", nargs="+", choices=list(KINDS), default=list(KINDS))
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS),
                        help="methods to run (ties is always run: the ratios are to it)")
    parser.add_argument("--cuda", action="store_true", help="merge on the GPU (mergekit's --cuda)")
    parser.add_argument("--num-threads", dest="threads", type=int,
                        help="torch CPU threads of every merge (mergekit's --num-threads; default: torch's)")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    build_inputs(args.workdir)
    if "lora" in args.kinds:
        run_once(args.workdir, "task_arithmetic", "lora")  # warm the LoRA merge cache and the page cache
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    names = ["ties", *(m for m in args.methods if m != "ties")]
    for repeat in range(args.repeats):
        order = names[repeat % len(names):] + names[: repeat % len(names)]
        for kind in args.kinds:
            for method in order:
                results.setdefault((kind, method), []).append(run_once(args.workdir, method, kind, args.cuda,
                                                                        args.threads))
                wall, rss = results[(kind, method)][-1]
                print(f"  {kind:4} {method:16} {wall:7.1f} s {rss:7.0f} MiB", flush=True)
    rows = []
    for kind in args.kinds:
        ties_wall, ties_rss = (statistics.median(run[i] for run in results[(kind, "ties")]) for i in (0, 1))
        for method in names:
            wall, rss = (statistics.median(run[i] for run in results[(kind, method)]) for i in (0, 1))
            rows.append([kind, method, f"{wall:.1f}", f"{wall / ties_wall:.2f}", f"{rss:.0f}", f"{rss / ties_rss:.2f}"])
    print(table(["inputs", "method", "wall s", "× ties", "RSS MiB", "× ties"], rows))


if __name__ == "__main__":
    main()
