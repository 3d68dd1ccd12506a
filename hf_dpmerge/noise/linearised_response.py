"""How much of the DP noise Adam(W) leaves in each coordinate, linearised along the run's own trajectory
(docs/design.md §6).

The optimizer consumes g_t = ḡ_t + n_t, n_t ~ N(0, σ_g²), plus data-free terms with a known restoring force h·p.
A noise perturbation δn moves Adam's state x = (δp, δm, δv) linearly, x_t = M_t·x_{t−1} + u_t·δn_t:

    δg_t = δn_t + h·δp_{t−1},   δm_t = β₁·δm_{t−1} + (1 − β₁)·δg_t,   δv_t = β₂·δv_{t−1} + (1 − β₂)·2·g_t·δg_t
    δp_t = (1 − η_t·λ_dec)·δp_{t−1} − η_t·[δm_t / ((1 − β₁ᵗ)·D_t) − m̂_t·δv_t / ((1 − β₂ᵗ)·2·√v̂_t·D_t²)]

(D_t = √v̂_t + ε), so Σ_t = M_t·Σ_{t−1}·M_tᵀ + σ_g²·u_t·u_tᵀ (six numbers per coordinate) ends with
Var(p_T) ≈ Σ_T[δp, δp], at the g_t, m̂_t, v̂_t the run had. It omits the data's curvature (an upper bound); its
inputs are the privatised gradients, Adam's state, the weights and public settings: post-processing.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

_PP, _PM, _PV, _MM, _MV, _VV = range(6)  # the symmetric 3×3 covariance of (δp, δm, δv), upper triangle
_FOLLOWED = ("Adam", "AdamW")


def supports_noise_response(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the response can be followed: torch's Adam/AdamW without AMSGrad or maximize."""
    return type(optimizer).__name__ in _FOLLOWED and not any(
        g.get("amsgrad") or g.get("maximize") for g in optimizer.param_groups)


def _decoupled(optimizer: torch.optim.Optimizer, group: dict) -> bool:
    """AdamW's decay (p ← (1 − η·λ)·p), also Adam's with ``decoupled_weight_decay=True``; else L2 on the gradient."""
    return bool(group.get("decoupled_weight_decay", type(optimizer).__name__ == "AdamW"))


class AdamNoiseResponse:
    """Propagates the per-coordinate noise covariance after every step of an Adam(W) ``optimizer``.

    ``noise_std`` is σ_g; ``restoring()`` is called once per step and returns the known restoring force h per
    parameter (a tensor broadcasting to it, keyed by the parameter) for the step just taken.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, noise_std: float,
                 restoring: Callable[[], dict[nn.Parameter, torch.Tensor | float]]) -> None:
        if not supports_noise_response(optimizer):
            raise ValueError(f"no linear noise response for {type(optimizer).__name__} (known: Adam, AdamW without "
                             "amsgrad/maximize)")
        self.noise_std = float(noise_std)
        self.restoring = restoring
        self.steps = 0
        self._covariance: dict[nn.Parameter, torch.Tensor] = {}
        self._handles = [optimizer.register_step_post_hook(self._after_step)]
        self._before: dict[nn.Parameter, torch.Tensor] = {}
        if any(g["weight_decay"] and not _decoupled(optimizer, g) for g in optimizer.param_groups):
            self._handles.append(optimizer.register_step_pre_hook(self._before_step))  # L2 decay reads p_{t−1}

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()

    def variances(self) -> dict[nn.Parameter, torch.Tensor]:
        """Var(p_T) per coordinate of every parameter that took at least one step."""
        return {param: state[_PP].clone() for param, state in self._covariance.items()}

    @torch.no_grad()
    def _before_step(self, optimizer: torch.optim.Optimizer, *_: object) -> None:
        self._before = {p: p.detach().float().clone() for g in optimizer.param_groups
                        if g["weight_decay"] and not _decoupled(optimizer, g)
                        for p in g["params"] if p.grad is not None}

    @torch.no_grad()
    def _after_step(self, optimizer: torch.optim.Optimizer, *_: object) -> None:
        self.steps += 1
        pulls = self.restoring()
        for group in optimizer.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, decay = float(group["lr"]), float(group["eps"]), float(group["weight_decay"])
            decoupled = _decoupled(optimizer, group)
            for param in group["params"]:
                if param.grad is None or param not in optimizer.state:
                    continue
                state = optimizer.state[param]
                pull = torch.as_tensor(pulls.get(param, 0.0), dtype=torch.float32, device=param.device)
                grad = param.grad.float()
                if not decoupled and decay:  # Adam's L2 decay: it steps on g + λ·p
                    pull, grad = pull + decay, grad + decay * self._before[param]
                self._step(param, grad, state["exp_avg"].float(), state["exp_avg_sq"].float(),
                           float(state["step"]), beta1, beta2, lr, eps, decay if decoupled else 0.0, pull)

    def _step(self, param: nn.Parameter, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
              step: float, beta1: float, beta2: float, lr: float, eps: float, decoupled_decay: float,
              pull: torch.Tensor) -> None:
        cov = self._covariance.get(param)
        if cov is None:
            cov = self._covariance[param] = torch.zeros(6, *param.shape, dtype=torch.float32, device=param.device)
        v_hat = exp_avg_sq / (1 - beta2**step)
        root = v_hat.sqrt()
        denominator = root + eps
        c_m = lr / ((1 - beta1**step) * denominator)  # ∂δp/∂δm_t
        c_v = -lr * (exp_avg / (1 - beta1**step)) / ((1 - beta2**step) * 2 * root.clamp(min=1e-30) * denominator**2)
        # rows of M (over δp, δm, δv) and u, per coordinate
        m_p, m_m = (1 - beta1) * pull, beta1
        v_p, v_v = (1 - beta2) * 2 * grad * pull, beta2
        u_m, u_v = 1 - beta1, (1 - beta2) * 2 * grad
        p_p = (1 - lr * decoupled_decay) - c_m * m_p - c_v * v_p
        p_m, p_v = -c_m * m_m, -c_v * v_v
        u_p = -(c_m * u_m + c_v * u_v)
        rows = ((p_p, p_m, p_v), (m_p, m_m, 0.0), (v_p, 0.0, v_v))
        inputs = (u_p, u_m, u_v)
        sigma = ((cov[_PP], cov[_PM], cov[_PV]), (cov[_PM], cov[_MM], cov[_MV]), (cov[_PV], cov[_MV], cov[_VV]))
        left = [[sum(rows[i][k] * sigma[k][j] for k in range(3)) for j in range(3)] for i in range(3)]  # M·Σ
        updated = [sum(left[i][k] * rows[j][k] for k in range(3)) + self.noise_std**2 * inputs[i] * inputs[j]
                   for i, j in ((0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2))]  # M·Σ·Mᵀ + σ_g²·u·uᵀ
        for index, value in enumerate(updated):
            cov[index].copy_(torch.as_tensor(value, dtype=torch.float32).expand(param.shape))
