"""The dp_aware noise model against re-runs of the packaged recipe that differ only in their DP noise.

Each re-run trains one task with ``examples/train_glue.py --lora_recipe one_phase --dp_seed 0`` (the same Poisson
batches every time) and its own seed of the Gaussian-noise stream. The variance across re-runs of each released
tensor is what dp_aware should predict from the shipped noise statistics (``merging/inputs.py``), computed per
re-run and averaged. One unit is the whole set of re-runs (kept under ``<work-dir>/rerun-<k>``, so a killed unit
resumes): predicted / measured variance per kind (LoRA B, ΔW = s·B·A, head weight, head bias) and the share of
the released B's energy that is noise. Report ``benchmarks/reports/noise_reruns/NOISE_RERUNS.md``.

    python -m benchmarks.studies.noise_reruns --task rotten_tomatoes --reruns 8
    python -m benchmarks.studies.noise_reruns --report-only
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path
from typing import Any
from unittest import mock

from benchmarks import harness
from benchmarks.harness import Unit
from benchmarks.markdown import table

KINDS = ("lora_B", "lora_B (walk, uncapped)", "lora_B (walk without the penalty)", "delta", "head.weight", "head.bias")


def _train(task: str, runs_dir: Path, noise_offset: int, flags: list[str]) -> None:
    """One re-run: the one-phase recipe, ``--dp_seed 0``, the noise stream's seed shifted by ``noise_offset``."""
    from hf_dpmerge.scripts.train import main
    from hf_dpmerge.training import dpsam_trainer
    from hf_dpmerge.training.dp.run_streams import NOISE_STREAM, stream_seed

    def shifted(dp_seed: int, identity: str, stream: str) -> int:
        seed = stream_seed(dp_seed, identity, stream)
        return seed + noise_offset if stream == NOISE_STREAM else seed

    with mock.patch.object(dpsam_trainer, "stream_seed", shifted):
        main(["--task", task, "--runs_dir", str(runs_dir), "--dp_seed", "0", "--lora_recipe", "one_phase", *flags])


def _tensors(adapter_dir: Path) -> dict:
    """Per kind and layer, the released tensor (B, ΔW, head weight/bias) of one re-run."""
    from hf_dpmerge.merging.inputs import adapter_weights

    adapter = adapter_weights(adapter_dir)
    out = {}
    for name, factor in adapter.factors.items():
        out[f"lora_B|{name}"] = factor.lora_b.double()
        out[f"delta|{name}"] = factor.scaling * factor.lora_b.double() @ factor.lora_a.double()
    for name in adapter.trained:
        out[f"head|{name}"] = adapter.tensors[adapter.trained[name]].double()
    return out


def _predicted(adapter_dir: Path) -> dict[str, float]:
    """Σ over each kind's coordinates of the merge's predicted noise variance for one release."""
    import torch

    from hf_dpmerge.merging.inputs import adapter_input, adapter_weights, input_lora_b_noise, input_noise_variance
    from hf_dpmerge.noise.variance import alignment_restoring, stats_noise_variance
    from hf_dpmerge.records.noise_record import NoiseStats
    from hf_dpmerge.records.record import PrivacyRecord

    reference = adapter_input(adapter_dir)
    adapter = adapter_weights(adapter_dir)
    record = PrivacyRecord.load(adapter_dir)
    stats = NoiseStats.load(adapter_dir)
    totals = dict.fromkeys(KINDS, 0.0)
    for name, factor in adapter.factors.items():
        _, variance_b = input_lora_b_noise(reference, name, {})
        totals["lora_B"] += float(torch.as_tensor(variance_b).expand(factor.lora_b.shape).sum())
        for kind, restoring, used in (
                ("lora_B (walk, uncapped)", alignment_restoring(record, factor, factor.saved_b), stats),
                # the simulated walk alone: the linearised response followed the penalty's pull during training
                ("lora_B (walk without the penalty)", 0.0, dataclasses.replace(stats, response_variances={}))):
            walk = stats_noise_variance(record, used, factor.saved_b, restoring)
            totals[kind] += float(torch.as_tensor(walk).expand(factor.lora_b.shape).sum())
        totals["delta"] += float(input_noise_variance(reference, name, {}).sum())
    for name, saved in adapter.trained.items():
        released = adapter.tensors[saved]  # its start (the seeded fresh head) is not in the release: no cap
        variance = input_noise_variance(reference, name, {})
        kind = "head.bias" if name.endswith("bias") else "head.weight"
        totals[kind] += float(torch.as_tensor(variance).expand(released.shape).sum())
    return totals


def _measured(adapter_dirs: list[Path]) -> tuple[dict[str, float], float]:
    """(Σ variance across re-runs per kind, mean energy of the released B's)."""
    import torch

    runs = [_tensors(directory) for directory in adapter_dirs]
    totals = dict.fromkeys(KINDS, 0.0)
    for key in runs[0]:
        kind, name = key.split("|", 1)
        if kind == "head":
            kind = "head.bias" if name.endswith("bias") else "head.weight"
        spread = float(torch.stack([run[key] for run in runs]).var(dim=0).sum())
        totals[kind] += spread
        if kind == "lora_B":
            totals["lora_B (walk, uncapped)"] += spread
            totals["lora_B (walk without the penalty)"] += spread
    energy = sum(float(run[key].square().sum()) for run in runs for key in run if key.startswith("lora_B|"))
    return totals, energy / len(runs)


class NoiseReruns(harness.Study, name="noise_reruns", schema=1):
    """One unit: ``--reruns`` noise-only re-runs of ``--task``, compared with the merge's predicted noise."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--task", default="rotten_tomatoes")
        parser.add_argument("--reruns", type=int, default=8)
        parser.add_argument("--train-flags", default="", help="train_glue.py flags added to every re-run (one string)")

    def plan(self, args: argparse.Namespace) -> list[Unit]:
        if args.reruns < 2:
            raise ValueError("--reruns: at least two re-runs measure a variance")
        return [Unit(f"{args.task}-{args.reruns}reruns",
                     {"task": args.task, "reruns": args.reruns, "flags": shlex.split(args.train_flags)})]

    def run(self, unit: Unit, work_dir: Path) -> dict[str, Any]:
        from hf_dpmerge.records.run_folders import ADAPTER_DIR

        s = unit.settings
        adapter_dirs = []
        for rerun in range(s["reruns"]):
            runs_dir = work_dir / f"rerun-{rerun}"
            if not (runs_dir / s["task"] / ADAPTER_DIR / "dp_noise_stats.safetensors").exists():
                _train(s["task"], runs_dir, rerun, s["flags"])
            adapter_dirs.append(runs_dir / s["task"] / ADAPTER_DIR)
        predicted = [_predicted(directory) for directory in adapter_dirs]
        measured, energy = _measured(adapter_dirs)
        mean = {kind: sum(p[kind] for p in predicted) / len(predicted) for kind in KINDS}
        return {"kinds": {kind: {"predicted": mean[kind], "measured": measured[kind],
                                 "ratio": mean[kind] / measured[kind] if measured[kind] > 0 else float("nan")}
                          for kind in KINDS},
                "energy": energy, "measured_share": measured["lora_B"] / energy,
                "predicted_share": mean["lora_B"] / energy}

    def report(self, stored: list[dict[str, Any]]) -> dict[str, str]:
        """One section per stored unit: predicted and measured variance per kind, and the noise share of B."""
        text = []
        for unit in stored:
            s, r = unit["settings"], unit["result"]
            rows = [[kind, f"{k['predicted']:.4g}", f"{k['measured']:.4g}", f"{k['ratio']:.3f}"]
                    for kind, k in r["kinds"].items()]
            text += [f"# The dp_aware noise model against {s['reruns']} noise-only re-runs ({s['task']})", "",
                     "Generated by `python -m benchmarks.studies.noise_reruns` (packaged defaults, `--dp_seed 0`, "
                     "the noise stream's",
                     f"seed shifted per re-run; extra flags: `{' '.join(s['flags']) or 'none'}`).",
                     "", table(["kind", "predicted (mean over re-runs)", "measured (variance across re-runs)",
                                "predicted / measured"], rows), "",
                     f"Released B energy (mean over re-runs): {r['energy']:.4g}; measured noise share "
                     f"{r['measured_share']:.3f}, predicted {r['predicted_share']:.3f}.", ""]
        return {"NOISE_RERUNS.md": "\n".join(text)}


if __name__ == "__main__":
    sys.exit(harness.main(NoiseReruns()))
