"""The mergekit method ``safe_merge``: add the useful task vectors only where an unwanted model changed little.

Per output tensor, with task vectors τ_i = W_i − W_0 and the inputs marked ``unwanted: true`` (u ∈ U):

    risk = max_{u∈U} |τ_u| (entry-wise),   t_p = its nearest-rank p-th percentile,
    W = W_0 + scale · 1[risk ≤ t_p] ⊙ Σ_{i∉U} weight_i · τ_i

ranked per entry within each tensor, since a LoRA ΔW spreads its change over every entry (docs/design.md §13).
``projection: away`` / ``onto`` replaces the mask by a Safe-LoRA-style projection (Hsu et al., NeurIPS 2024,
arXiv:2405.16833, §3): W = W_0 + scale·(I − P)·Σ_{i∉U} weight_i·τ_i, or P·…, P the orthogonal projector onto the
column space of the marked inputs' task vectors. The unwanted task vector itself is never added; to subtract it,
use task negation (``merge_configs/negation.yaml``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import torch
from mergekit.merge_methods import register, registered_methods
from mergekit.merge_methods.base import (
    BasePolicy,
    InputContract,
    PerNonBase,
    TensorGroup,
)
from mergekit.merge_methods.easy_define import merge_method
from pydantic import Field

from hf_dpmerge.merging.inputs import input_settings
from hf_dpmerge.merging.validation import check_parameter_keys

Percentile = Annotated[float, Field(ge=0, le=100)]
Projection = Literal["none", "away", "onto"]
SUBSPACE_RTOL = 1e-5  # singular values below this share of the largest are numerical rank, not direction


def percentile_threshold(values: torch.Tensor, percentile: float) -> torch.Tensor:
    """The nearest-rank ``percentile`` of ``values``: its ⌈p·n/100⌉-th smallest entry (the smallest when p = 0).

    ``kthvalue`` rather than ``torch.quantile``, which refuses tensors of more than 2²⁴ entries.
    """
    flat = values.flatten()
    rank = max(1, math.ceil(percentile / 100 * flat.numel()))
    return flat.kthvalue(min(rank, flat.numel())).values


def subspace_basis(vectors: Sequence[torch.Tensor]) -> torch.Tensor:
    """An orthonormal basis U (columns) of the column space of the task vectors (their rows' span for 1-D
    tensors): the left singular vectors of [τ_1 … τ_k] with singular value > SUBSPACE_RTOL·σ_max (no columns
    when every τ is 0)."""
    stacked = torch.cat([v.reshape(v.shape[0], -1) if v.ndim > 1 else v.reshape(-1, 1) for v in vectors], dim=1)
    left, singular, _ = torch.linalg.svd(stacked.double(), full_matrices=False)
    if singular.numel() == 0 or singular[0] == 0:
        return left[:, :0]
    return left[:, singular > SUBSPACE_RTOL * singular[0]]


def project(delta: torch.Tensor, basis: torch.Tensor, projection: str) -> torch.Tensor:
    """P·δ (``onto``) or (I − P)·δ (``away``), P = U·Uᵀ acting on δ's first axis (a 1-D δ as one column)."""
    matrix = delta.reshape(delta.shape[0], -1) if delta.ndim > 1 else delta.reshape(-1, 1)
    inside = (basis @ (basis.T @ matrix.double())).to(matrix.dtype)
    return (inside if projection == "onto" else matrix - inside).reshape(delta.shape)


def safe_merge_tensor(
    base: torch.Tensor,
    useful: Sequence[torch.Tensor],
    weights: Sequence[float],
    unwanted: Sequence[torch.Tensor],
    *,
    percentile: float,
    scale: float,
    projection: str = "none",
) -> torch.Tensor:
    """W_0 + scale · 1[max_u |τ_u| ≤ t_p] ⊙ Σ_i weight_i τ_i, or with ``projection`` W_0 + scale·(I − P or P)·Σ_i
    weight_i τ_i (module docstring); computed in float32, returned in ``base``'s dtype."""
    if not useful or not unwanted:
        raise ValueError("safe_merge needs at least one useful input and one input marked 'unwanted: true'")
    base32 = base.float()
    if base.numel() == 0:
        return base
    combined = sum(w * (t.float() - base32) for t, w in zip(useful, weights, strict=True))
    marked = [u.float() - base32 for u in unwanted]
    if projection != "none":  # marked inputs that left the tensor unchanged give P = 0: away keeps all, onto adds 0
        return (base32 + scale * project(combined, subspace_basis(marked), projection)).to(base.dtype)
    risk = torch.stack([m.abs() for m in marked]).amax(dim=0)
    # ties at t_p are kept: where risk ≡ 0 the useful vectors go in whole; percentile 100 is plain task arithmetic
    keep = risk <= percentile_threshold(risk, percentile)
    return (base32 + scale * keep * combined).to(base.dtype)


@merge_method(
    name="safe_merge",
    pretty_name="Safe merge (useful task vectors only where an unwanted model changed little)",
    contract=InputContract(base=BasePolicy.REQUIRED, min_non_base=2),
)
def safe_merge(
    group: TensorGroup,
    unwanted: PerNonBase[bool] = False,
    weight: PerNonBase[float] = 1.0,
    percentile: Percentile = 50.0,
    scale: float = 1.0,
    projection: Projection = "none",
) -> torch.Tensor:
    entries = group.non_base
    return safe_merge_tensor(
        group.base.tensor,
        [e.tensor for e in entries if not unwanted[e.id]],
        [weight[e.id] for e in entries if not unwanted[e.id]],
        [e.tensor for e in entries if unwanted[e.id]],
        percentile=percentile,
        scale=scale,
        projection=projection,
    )


def check_safe_merge_config(config: Any) -> None:
    """Before any output exists: known keys only, no percentile beside a projection (which replaces the mask it
    sets), and at least one unwanted and one useful input. (mergekit checks the projection's value.)"""
    per_input = {p.name for p in safe_merge.spec.input_parameters}
    check_parameter_keys(config, {p.name for p in safe_merge.spec.shared_parameters}, per_input)
    shared = config.parameters or {}
    projection = shared.get("projection", "none")
    if projection != "none" and "percentile" in shared:
        raise ValueError(f"safe_merge: 'percentile' sets the entry mask, which 'projection: {projection}' replaces; "
                         "remove one of them")
    default = bool((config.parameters or {}).get("unwanted", False))
    flags = [bool(settings.get("unwanted", default)) for _, settings, _ in input_settings(config)]
    if not any(flags) or all(flags):
        raise ValueError(
            f"safe_merge: mark the model(s) whose behaviour must not spread with 'parameters: {{unwanted: true}}' "
            f"and leave at least one useful model unmarked (got {sum(flags)} unwanted of {len(flags)} inputs)"
        )


if safe_merge.spec.name not in {method.spec.name for method in registered_methods()}:
    register(safe_merge)
