"""Benchmark: mergekit ``ties`` and ``task_arithmetic`` against ``cauchy_poe`` and ``dp_aware``.

Inputs are built from a config (no downloads): a BERT-base-sized sequence classifier (~110M parameters,
random weights) as the base, four LoRA adapters (r=8 on query/value, each with a privacy record) merged
as ``base+adapter`` (``lora``), four full-model variants (base + a 1e-3 perturbation of every weight;
``full``) and eight of them (``full8``). Each method runs as a separate ``mergekit-yaml`` process; runs are
interleaved (method order rotates per repeat), the LoRA merge cache is warmed first, and wall time and the
process's peak RSS are printed as ratios to ``ties``. Targets: ``cauchy_poe`` ≤ 0.5× ties' wall time and
≤ 1.0× its peak RSS on full models, ≤ 0.5× on LoRA inputs. ``--cuda`` passes mergekit's ``--cuda``,
``--num-threads N`` its ``--num-threads N`` (to every method alike: on a machine shared with other jobs,
torch's default of one OpenMP thread per core makes LAPACK calls wait at thread barriers, measured 4–7×
slower than one thread at load average 8 on 2 cores).
Usage: ``python benchmarks/merge.py [--workdir DIR] [--repeats N] [--kinds lora full full8] [--methods ...]
[--cuda] [--num-threads N]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import BertConfig, BertForSequenceClassification

from hf_dpmerge.merging.merge_config import lora_reference, merge_config_yaml, mergekit_config
from hf_dpmerge.records.fingerprint import base_fingerprint, peft_base_tensors
from hf_dpmerge.records.record import PrivacyRecord

METHODS: dict[str, dict[str, float]] = {
    "ties": {"weight": 1.0, "density": 0.2},
    "task_arithmetic": {"weight": 1.0, "lambda": 0.3},
    "cauchy_poe": {"lambda": 1.0, "tol": 0.01},
    "dp_aware": {"lambda": 0.3},
}
ADAPTERS = 4
VARIANTS = 8
KINDS = {"lora": ADAPTERS, "full": ADAPTERS, "full8": VARIANTS}
REPO = Path(__file__).resolve().parents[1]  # measure this checkout, whichever one is installed


def _record(base_hash: str, names: list[str]) -> PrivacyRecord:
    return PrivacyRecord(
        epsilon=8.0, delta=1e-5, accountant="prv", noise_multiplier=0.6, effective_noise_multiplier=0.6,
        sample_rate=0.004, steps=2000, max_grad_norm=1.0, expected_batch_size=256, num_samples=64_000,
        sam_mode="none", sam_rho=0.0, align_lambda=0.0, optimizer={"name": "AdamW", "lr": 2e-5},
        sum_lr_squared=2000 * 2e-5**2, base_model="bert-base-sized", base_model_hash=base_hash,
        base_model_hash_tensors=names, versions={},
    )


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
        _record(base_fingerprint(tensors), sorted(tensors)).save(workdir / f"adapter{index}")
    hashed = ["bert.encoder.layer.0.attention.self.query.weight"]
    base_hash = base_fingerprint({name: base.state_dict()[name] for name in hashed})
    for index in range(VARIANTS):
        variant = BertForSequenceClassification.from_pretrained(workdir / "base")
        generator = torch.Generator().manual_seed(200 + index)
        with torch.no_grad():
            for parameter in variant.parameters():
                parameter.add_(1e-3 * torch.randn(parameter.shape, generator=generator))
        variant.save_pretrained(workdir / f"full{index}")
        _record(base_hash, hashed).save(workdir / f"full{index}")
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
    command = [str(Path(sys.executable).with_name("mergekit-yaml")), str(_config(workdir, method, kind)), str(out),
               "--lora-merge-cache", str(workdir / "lora_cache"), "--quiet", "--no-write-model-card",
               *(["--cuda"] if cuda else []), *(["--num-threads", str(threads)] if threads else [])]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise RuntimeError(f"{method} on {kind} inputs failed: {process.stderr.read().decode()[-2000:]}")
    return wall, usage.ru_maxrss / 1024


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
    print(f"\n{'inputs':6} {'method':16} {'wall s':>8} {'× ties':>7} {'RSS MiB':>8} {'× ties':>7}")
    for kind in args.kinds:
        ties_wall = statistics.median(w for w, _ in results[(kind, "ties")])
        ties_rss = statistics.median(r for _, r in results[(kind, "ties")])
        for method in names:
            wall = statistics.median(w for w, _ in results[(kind, method)])
            rss = statistics.median(r for _, r in results[(kind, method)])
            print(f"{kind:6} {method:16} {wall:8.1f} {wall / ties_wall:7.2f} {rss:8.0f} {rss / ties_rss:7.2f}")


if __name__ == "__main__":
    main()
