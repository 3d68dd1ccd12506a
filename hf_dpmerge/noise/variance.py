"""The DP-SGD noise left in a released task vector, per coordinate (docs/design.md §6).

Each step's privatised gradient carries noise N(0, σ_g²) per coordinate, σ_g = σ·C/B_exp (σ per query). With the
adapter's ``dp_noise_stats.safetensors``: SGD/momentum exactly, s² = σ_g²·Σ_s w_s²; Adam(W) by the coordinate's
r̂_k² = max(v̂_k/σ_g² − 1, 0): the simulated S(r̂_k, h) below r̂ = 0.5, from there the run's linearised response
(:mod:`hf_dpmerge.noise.linearised_response`) capped by the pure-noise walk S(0, h)
(:mod:`~hf_dpmerge.noise.optimizer_response`; h: the alignment penalty's pull, :func:`alignment_restoring`).
Without the statistics, from the record alone with a warning (SGD σ_g²·Σ_t η_t²/(1 − μ)², Adam Σ_t η_t²). Heads
use their own learning rate; :func:`capped_variance` caps s² by the released weights. A LoRA delta s·B·A with
factor noise V_A, V_B has the unbiased plug-in from the released factors (V_A = 0 for a frozen A)

    Var(ΔW_ij) = s²·[Σ_r B̃_ir²·V_A,rj + Σ_r V_B,ir·Ã_rj² − Σ_r V_B,ir·V_A,rj]   (clipped at 0)
"""

from __future__ import annotations

import torch

from hf_dpmerge.lora import LoraFactor, penalty_curvature
from hf_dpmerge.noise.optimizer_response import adam_variance, sgd_variance
from hf_dpmerge.records.noise_record import NoiseStats
from hf_dpmerge.records.record import PrivacyRecord

_SGD_HYPER = ("momentum", "dampening", "nesterov")
# r̂ from which an Adam(W) coordinate takes the linearised response along its run rather than the simulated S(r̂, h)
LINEAR_RESPONSE_MIN_RATIO = 0.5
# the cap's confidence: s² ≤ mean(τ̃²)·n / χ²_n(α), α = 2.5 % (:func:`capped_variance`)
_CAP_ALPHA = 0.025


def _noise_std(record: PrivacyRecord) -> float:
    return record.noise_multiplier * record.max_grad_norm / record.expected_batch_size


def record_noise_variance(record: PrivacyRecord, head: bool = False) -> float:
    """s² of a directly trained parameter from the record alone (the fallback; 0 if not DP)."""
    if not record.dp:
        return 0.0
    name = str(record.optimizer.get("name", "")).lower()
    lr, head_lr = record.optimizer.get("lr"), record.optimizer.get("head_lr")
    rate = (float(head_lr) / float(lr)) ** 2 if head and lr and head_lr else 1.0
    if "adam" in name:  # noise-dominated: over-states the variance of informative coordinates
        return rate * float(record.sum_lr_squared)
    if name == "sgd":
        momentum = float(record.optimizer.get("momentum") or 0.0)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"SGD momentum {momentum} is outside [0, 1)")
        return rate * _noise_std(record) ** 2 * record.sum_lr_squared / (1.0 - momentum) ** 2
    raise ValueError(
        f"no noise model for optimizer {record.optimizer.get('name')!r} (known: SGD, Adam, AdamW); "
        f"give the input's noise_std instead"
    )


def alignment_restoring(record: PrivacyRecord, factor: LoraFactor, saved_name: str) -> torch.Tensor | float:
    """The alignment penalty's restoring force h on each coordinate of one saved LoRA factor (0 without it).

    R = λ·‖s·B·A‖_F² (docs/design.md §4) adds ∇_B R = 2λs²·B·(A Aᵀ) and ∇_A R = 2λs²·(BᵀB)·A to every noisy
    gradient: each B_ir is pulled back with h = 2λs²·(A Aᵀ)_rr, each A_rj with 2λs²·(BᵀB)_rr (the diagonal; the
    off-diagonal terms couple coordinates with nearly orthogonal rows of a random A). Computed from the released
    factors and the record's λ: public, data-free. Shapes broadcast against the saved B (d_out×r) and A (r×d_in).
    """
    penalty = float(record.align_lambda or 0.0)
    if penalty == 0.0:
        return 0.0
    curvature_a, curvature_b = penalty_curvature(factor, penalty)
    if saved_name == factor.saved_b:
        return curvature_b
    if saved_name == factor.saved_a:
        return curvature_a
    raise ValueError(f"{saved_name} is neither factor of LoRA layer {factor.name}")


def stats_noise_variance(
    record: PrivacyRecord, stats: NoiseStats, saved_name: str, restoring: torch.Tensor | float = 0.0
) -> torch.Tensor | float | None:
    """s² of one trained tensor (per coordinate for Adam) from the shipped statistics; None if it is not in them.

    σ_g comes from the record (so per-model overrides of σ, C or B_exp apply); η_t, v̂ and the optimizer's
    hyper-parameters from the statistics; ``restoring`` is a known restoring force h on the tensor's
    coordinates (:func:`alignment_restoring`).
    """
    entry = stats.parameter(saved_name)
    if entry is None:
        return None
    if not record.dp:
        return 0.0
    lrs, weight_decay, second_moment = entry
    name = str(stats.optimizer.get("name", "")).lower()
    if "adam" in name and second_moment is not None:
        betas = stats.optimizer.get("betas", (0.9, 0.999))
        eps = float(stats.optimizer.get("eps", 1e-8))
        noise_std = _noise_std(record)
        simulated = adam_variance(second_moment, lrs.tolist(), noise_std, betas, eps, weight_decay, restoring)
        response = stats.response_variances.get(saved_name)
        if response is None or stats.noise_std <= 0:
            return simulated
        response = response.to(simulated) * (noise_std / stats.noise_std) ** 2  # linear in σ_g²
        # a linearisation through a step with a tiny v̂_t can explode; Adam's own bound is the pure-noise walk S(0, h)
        walk = adam_variance(torch.full_like(second_moment, noise_std**2), lrs.tolist(), noise_std, betas, eps,
                             weight_decay, restoring)
        signal_to_noise = (second_moment.double() / noise_std**2 - 1).clamp(min=0).sqrt()
        return torch.where(signal_to_noise.to(simulated.device) >= LINEAR_RESPONSE_MIN_RATIO,
                           torch.minimum(response, walk), simulated)
    if name == "sgd":
        hyper = {key: stats.optimizer[key] for key in _SGD_HYPER if key in stats.optimizer}
        return sgd_variance(lrs.tolist(), _noise_std(record), restoring, weight_decay=weight_decay, **hyper)
    raise ValueError(f"no noise model for optimizer {stats.optimizer.get('name')!r} (known: SGD, Adam, AdamW)")


def lora_noise_variance(
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scaling: float,
    variance_a: torch.Tensor | float,
    variance_b: torch.Tensor | float,
) -> torch.Tensor:
    """Var(ΔW_ij) for ΔW = scaling·B·A (B: d_out×r, A: r×d_in) from the released (noisy) factors and their
    independent noise variances V_A, V_B: the unbiased plug-in of the module docstring (V_A = 0: frozen A)."""
    a, b = lora_a.double(), lora_b.double()
    v_a = torch.as_tensor(variance_a, dtype=torch.float64, device=a.device).expand_as(a)
    v_b = torch.as_tensor(variance_b, dtype=torch.float64, device=b.device).expand_as(b)
    # in the clean factors Var = s²·[B²·V_A + V_B·A² + V_B·V_A]; E[B̃²] = B² + V_B and E[Ã²] = A² + V_A, so the
    # noisy factors in that form would over-state it by 2·s²·V_B·V_A: the sign of the last term corrects it
    variance = b.square() @ v_a + v_b @ a.square() - v_b @ v_a
    return (scaling**2 * variance.clamp_(min=0)).float()


def capped_variance(variance: torch.Tensor | float, task_vector: torch.Tensor) -> torch.Tensor | float:
    """s² scaled down, if need be, so that its mean over the tensor is at most an upper confidence bound on it from
    the released task vector τ̃ (from a known start): mean(τ̃²)·n/χ²_n(α), α = 2.5 %, n coordinates. For a tensor
    of pure noise n·mean(τ̃²)/s² ~ χ²_n, so the bound holds with probability 1 − α, and signal only raises τ̃²; it is
    ≈ mean(τ̃²) for large tensors and loose for tiny ones (a 2-class head bias: 40×), whose mean square is too noisy
    to cap anything. Unchanged when s² = 0."""
    from scipy.stats import chi2

    mean = float(torch.as_tensor(variance, dtype=torch.float64).expand(task_vector.shape).mean())
    if mean <= 0:
        return variance
    count = task_vector.numel()
    bound = float(task_vector.double().square().mean()) * count / float(chi2.ppf(_CAP_ALPHA, count))
    return variance if bound >= mean else variance * (bound / mean)
