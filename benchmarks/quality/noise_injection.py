"""The noise-injection arm of the stress grid (no training): known Gaussian noise on non-private adapters.

Every LoRA factor entry of a non-private adapter gets independent N(0, σ²) noise (A and B alike; the task head is
left as trained), which is what a DP noise model with V_A = V_B = σ² describes. The noisy adapter keeps its
non-private record (it has no DP guarantee: the noise is not calibrated to any sensitivity) with σ stated in
``extra.injected_noise_std``; the merges that read a noise level are given the true per-tensor noise of ΔW = s·B·A
instead (:func:`dense_noise_std`), so dp_aware and cauchy_poe are checked against a known noise model:

    Var(ΔW_ij) = s²·[Σ_r B_ir²·σ² + Σ_r σ²·A_rj² + r·σ⁴]   (the clean factors; docs/design.md §6)
"""

from __future__ import annotations

import math
import shutil
import zlib
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from hf_dpmerge.lora import load_saved_adapter
from hf_dpmerge.records.record import PrivacyRecord
from hf_dpmerge.training.encoder_adapter import export_encoder_adapter
from hf_dpmerge.utils.adapter_files import ADAPTER_SAFETENSORS_NAME

LORA_KEYS = (".lora_A.", ".lora_B.")


def _generator(seed: int, task: str, sigma: float) -> torch.Generator:
    """One independent stream per (seed, task, σ)."""
    state = np.random.SeedSequence([seed, zlib.crc32(task.encode()), round(sigma * 1e9)]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(state))


def add_factor_noise(tensors: dict[str, torch.Tensor], sigma: float,
                     generator: torch.Generator) -> dict[str, torch.Tensor]:
    """``tensors`` with N(0, σ²) added to every LoRA factor (keys holding ``.lora_A.`` / ``.lora_B.``)."""
    if not (sigma >= 0 and math.isfinite(sigma)):
        raise ValueError(f"noise σ must be finite and ≥ 0, got {sigma}")
    factors = [key for key in tensors if any(part in key for part in LORA_KEYS)]
    if not factors:
        raise ValueError("the adapter has no LoRA factors to add noise to")
    noisy = dict(tensors)
    for key in factors:
        noise = torch.randn(tensors[key].shape, generator=generator, dtype=torch.float64) * sigma
        noisy[key] = (tensors[key].double() + noise).to(tensors[key].dtype)
    return noisy


def inject_noise(source_run: Path, target_run: Path, sigma: float, seed: int) -> None:
    """``target_run/{adapter,encoder_adapter}``: ``source_run``'s adapter with N(0, σ²) on its LoRA factors."""
    source, target = source_run / "adapter", target_run / "adapter"
    record = PrivacyRecord.load(source)
    if record.dp:
        raise ValueError(f"{source} is a DP adapter: the noise-injection arm adds noise to non-private ones")
    if target_run.exists():
        shutil.rmtree(target_run)
    shutil.copytree(source, target, symlinks=True)
    tensors = load_file(source / ADAPTER_SAFETENSORS_NAME)
    noisy = add_factor_noise(tensors, sigma, _generator(seed, record.task or source_run.name, sigma))
    save_file(noisy, target / ADAPTER_SAFETENSORS_NAME, metadata={"format": "pt"})
    record.extra["injected_noise_std"] = sigma
    record.save(target)
    export_encoder_adapter(target, target_run / "encoder_adapter")


def dense_noise_std(clean_encoder_adapter: Path, sigma: float) -> list[dict[str, float | str | None]]:
    """Per tensor, the RMS noise std of ΔW for factor noise σ, as mergekit conditional ``noise_std`` entries
    (``filter`` = the tensor's name; a final entry gives 0 to every tensor the adapter leaves alone).
    The factors are the clean ones, noise added to both: E over the noise, not the released-factor plug-in."""
    entries: list[dict[str, float | str | None]] = []
    for name, factor in load_saved_adapter(clean_encoder_adapter).factors.items():
        # From the clean factors: Var(ΔW_ij) = s²·(σ²·Σ_k B_ik² + σ²·Σ_k A_kj² + r·σ⁴) (the released-factor
        # plug-in of lora_noise_variance subtracts r·σ⁴ instead: it starts from noisy factors).
        a, b = factor.lora_a.double(), factor.lora_b.double()
        rows, columns = b.square().sum(dim=1, keepdim=True), a.square().sum(dim=0, keepdim=True)
        variance = factor.scaling**2 * (sigma**2 * (rows + columns) + a.shape[0] * sigma**4)
        entries.append({"filter": name, "value": float(variance.mean().sqrt())})
    return [*entries, {"filter": None, "value": 0.0}]
