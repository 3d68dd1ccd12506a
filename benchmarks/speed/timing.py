"""What the timing scripts share: each arm measured in a fresh process (its peak RSS its own), arms interleaved
round by round so machine load affects them alike, the median over rounds; a trainer's median step time; the
privacy record of a synthetic release. Run from any folder: the processes import this checkout."""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(REPO)}


def run_arms(module: str, arms: Sequence[str], rounds: int, argv: Sequence[str]) -> dict[str, dict[str, float]]:
    """``python -m <module> --_arm ARM *argv`` once per arm and round; per arm, the median of each number its last
    output line (JSON) reports."""
    results: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
    for round_index in range(rounds):
        for arm in arms:
            out = subprocess.run([sys.executable, "-m", module, "--_arm", arm, *argv], check=True,
                                 capture_output=True, text=True, cwd=REPO, env=ENV).stdout.strip().splitlines()[-1]
            results[arm].append(json.loads(out))
            print(f"round {round_index + 1}/{rounds} {arm}: {results[arm][-1]}", file=sys.stderr, flush=True)
    return {arm: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for arm, runs in results.items()}


def timed_process(command: Sequence[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one process run to its end; raises with its stderr's tail if it fails."""
    start = time.perf_counter()
    process = subprocess.Popen(list(command), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {process.stderr.read().decode()[-2000:]}")
    return wall, usage.ru_maxrss / 1024


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def median_step_seconds(trainer, inputs: dict, steps: int) -> float:
    """The median wall time of ``steps`` optimizer steps on ``inputs`` (training step, optimizer step, zeroed
    gradients), after one untimed step that warms up (and gives dp_sat its previous gradient)."""
    times = []
    for i in range(steps + 1):
        start = time.perf_counter()
        trainer.training_step(trainer.model, dict(inputs))
        trainer.optimizer.step()
        trainer.model.zero_grad()
        if i:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def synthetic_record(base_model: str, base_hash: str, hashed: list[str], **extra):
    """A privacy record of a synthetic ε = 8 release (inputs for the merge timings)."""
    from hf_dpmerge.records.record import PrivacyRecord

    return PrivacyRecord(
        epsilon=8.0, delta=1e-5, accountant="prv", noise_multiplier=0.6, effective_noise_multiplier=0.6,
        sample_rate=0.004, steps=2000, max_grad_norm=1.0, expected_batch_size=256, num_samples=64_000,
        sam_mode="none", sam_rho=0.0, align_lambda=0.0, optimizer={"name": "AdamW", "lr": 2e-5},
        sum_lr_squared=2000 * 2e-5**2, base_model=base_model, base_model_hash=base_hash,
        base_model_hash_tensors=hashed, versions={}, extra=extra)
