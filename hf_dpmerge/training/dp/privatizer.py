"""The Gaussian mechanism on clipped per-sample gradients (DP-SGD, Abadi et al. 2016, arXiv:1607.00133; opacus's
noise model):

    g̃ = ( Σ_i clip_C(g_i) + N(0, σ²C² I) ) / B_exp,   clip_C(g) = g · min(1, C / ‖g‖₂)

g_i over *all* trainable parameters as one vector, B_exp the expected (public) Poisson batch size. Automatic
clipping (``clipping="automatic"``; Bu et al., NeurIPS 2023, arXiv:2206.07136, §4) normalises g_i ↦ g_i/(‖g_i‖ + γ)
instead: sensitivity 1, noise N(0, σ²I) (docs/design.md §15.4). Unlike opacus's ``DPOptimizer`` it releases the
privatised gradient without stepping, as DP-SAT and the two-query step need. With P processes only the main one
adds the noise before one all-reduce (as opacus' ``DistributedDPOptimizer``). User-level: the clipped quantity is a
unit's summed gradient g_u = Σ_{i∈u} g_i, B_exp the expected units per draw
(:meth:`GradientPrivatizer.accumulate_units`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

CLIPPING_MODES = ("flat", "automatic")


class GradientPrivatizer:
    def __init__(
        self,
        params: Sequence[nn.Parameter],
        *,
        max_grad_norm: float,
        noise_multiplier: float,
        expected_batch_size: int,
        generator: torch.Generator | None = None,
        adds_noise: bool = True,
        sum_over_processes: Callable[[list[torch.Tensor]], list[torch.Tensor]] | None = None,
        clipping: str = "flat",
        gamma: float = 0.01,
    ):
        if clipping not in CLIPPING_MODES:
            raise ValueError(f"clipping must be one of {CLIPPING_MODES}, got {clipping!r}")
        self.params = list(params)
        self.clipping = clipping
        self.gamma = gamma
        self.adds_noise = adds_noise
        self.sum_over_processes = sum_over_processes
        self.max_grad_norm = max_grad_norm
        self.noise_multiplier = noise_multiplier
        self.expected_batch_size = expected_batch_size
        self.generator = generator
        self._sums: list[torch.Tensor] = [torch.zeros_like(p) for p in self.params]
        self._unit_sums: list[torch.Tensor] | None = None
        self.num_examples = 0

    @property
    def sensitivity(self) -> float:
        """The bound on one contribution's norm: C, or 1 under automatic clipping."""
        return 1.0 if self.clipping == "automatic" else self.max_grad_norm

    def reset(self) -> None:
        for s in self._sums:
            s.zero_()
        self._unit_sums = None
        self.num_examples = 0

    def accumulate_units(
        self, per_sample_grads: Sequence[torch.Tensor], unit_positions: torch.Tensor, num_units: int
    ) -> None:
        """Add each row's gradient, unclipped, to the sum of its unit (``unit_positions`` ∈ [0, num_units) per row);
        the unit sums are clipped at :meth:`release`."""
        if len(per_sample_grads) != len(self.params):
            raise ValueError("one per-sample gradient tensor is needed per trainable parameter")
        if self._unit_sums is None:
            self._unit_sums = [p.new_zeros((num_units, *p.shape)) for p in self.params]
        for total, grad in zip(self._unit_sums, per_sample_grads):
            total.index_add_(0, unit_positions.to(total.device), grad.to(total.dtype))

    def accumulate(self, per_sample_grads: Sequence[torch.Tensor]) -> torch.Tensor:
        """Clip each example's joint gradient to C (or normalise it, automatic clipping) and add it to the
        running sum; returns the raw norms."""
        if len(per_sample_grads) != len(self.params):
            raise ValueError("one per-sample gradient tensor is needed per trainable parameter")
        batch = per_sample_grads[0].shape[0]
        if batch == 0:
            return per_sample_grads[0].new_zeros(0)
        flat_norms = torch.stack([g.reshape(batch, -1).norm(2, dim=1) for g in per_sample_grads], dim=1)
        norms = flat_norms.norm(2, dim=1)
        if self.clipping == "automatic":
            factors = 1 / (norms + self.gamma)
        else:
            factors = (self.max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
        for total, grad in zip(self._sums, per_sample_grads):
            total.add_(torch.einsum("i,i...->...", factors.to(grad.dtype), grad).to(total.dtype))
        self.num_examples += batch
        return norms

    def accumulate_grad_samples(self, unit_positions: torch.Tensor | None = None, num_units: int = 0) -> None:
        """Consume ``p.grad_sample`` left by an opacus GradSampleModule backward pass: clipped per row, or
        added to per-unit sums when ``unit_positions`` is given."""
        grads = [p.grad_sample for p in self.params]
        missing = [i for i, g in enumerate(grads) if g is None]
        if missing:
            raise RuntimeError(f"{len(missing)} trainable parameters got no per-sample gradient")
        if unit_positions is None:
            self.accumulate(grads)
        else:
            self.accumulate_units(grads, unit_positions, num_units)
        for p in self.params:
            p.grad_sample = None

    def release(self) -> list[torch.Tensor]:
        """Clip pending unit sums, add N(0, σ²C²) once to the clipped sum (summed over processes) and divide
        by B_exp; resets."""
        if self._unit_sums is not None:
            self.accumulate(self._unit_sums)
        std = self.noise_multiplier * self.sensitivity
        totals = []
        for total in self._sums:
            if self.adds_noise:
                noise = torch.normal(0.0, std, size=total.shape, generator=self.generator, device=total.device)
                totals.append(total + noise.to(total.dtype))
            else:
                totals.append(total.clone())
        # only the main process added noise: the all-reduce gives every process Σ_r S_r + N(0, σ²C²I), the noise
        # drawn once from one generator (a seeded P-process run draws the seeded 1-process run's noise)
        if self.sum_over_processes is not None:
            totals = self.sum_over_processes(totals)
        self.reset()
        return [total / self.expected_batch_size for total in totals]
