"""The mergekit 0.1.5 methods ``cauchy_poe``, ``dp_aware``, the spectral ``tsv``, ``iso_c``, ``iso_cts``, ``wudi``
and ``emr``: parameter specs and per-tensor kernels (the maths: :mod:`.cauchy_poe`, :mod:`.dp_aware`, :mod:`.tsv`,
:mod:`.iso`, :mod:`.wudi`, :mod:`.emr`).

Importing this module registers them with mergekit, as mergekit's own registry does for its methods.
mergekit calls :meth:`merge_group` once per output tensor with the base and the inputs of that tensor.
Every method needs a base (task vectors τ_i = W_i − W_0) and takes, per input, the overridable noise-model
values of :data:`~hf_dpmerge.merging.inputs.RECORD_OVERRIDES` plus ``noise_std``. They run the same
through ``mergekit-yaml``/``run_merge`` and ``mergekit.merge_methods.api.merge_state_dicts`` (in-memory inputs
have no privacy record: ``dp_aware`` then needs ``allow_non_private: true`` and ``noise_std`` per input or
``noise: estimate``, and says so otherwise; so does a spectral method's ``noise_floor: record``).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Optional

import torch
from mergekit.merge_methods import register, registered_methods
from mergekit.merge_methods.base import (
    MISSING,
    BasePolicy,
    GroupMergeMethod,
    InputContract,
    MergeMethodSpec,
    ParameterScope,
    ParameterSpec,
    TensorEntry,
    TensorGroup,
)
from pydantic import Field

from hf_dpmerge.merging.adapters.factor_space import SPECTRAL_KERNELS
from hf_dpmerge.merging.inputs import (
    NOISE_STD,
    RECORD_OVERRIDES,
    check_finite,
    factor_noise_variance,
    input_lora_factors,
    input_lora_noise,
    input_noise_edge,
    input_noise_variance,
    require_private,
)
from hf_dpmerge.merging.methods.cauchy_poe import cauchy_poe_merge
from hf_dpmerge.merging.methods.dp_aware import dp_aware_merge, lora_factor_estimate
from hf_dpmerge.merging.methods.emr import emr_elect
from hf_dpmerge.merging.methods.spectral import TaskVector, merged_as_matrix
from hf_dpmerge.merging.methods.wudi import Solver

ALLOW_NON_PRIVATE = "allow_non_private"
Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]


def _shared(name: str, kind: Any, default: Any) -> ParameterSpec:
    """A parameter shared by all inputs; ``default=MISSING`` makes it required (``lambda``: the merged task
    vector's scale has no safe default, and a misspelt ``parameters:`` block must not merge at λ = 1)."""
    return ParameterSpec(name, kind, ParameterScope.SHARED, default=default)


def _per_input_specs() -> tuple[ParameterSpec, ...]:
    optional = {name: Optional[kind] for name, kind in RECORD_OVERRIDES.items()}
    optional[NOISE_STD] = Optional[NonNegative]
    return tuple(ParameterSpec(name, kind, ParameterScope.NON_BASE, default=None) for name, kind in optional.items())


def _overrides(parameters: Mapping[str, Any], reference: Any) -> dict[str, Any]:
    return {name: parameters[name][reference] for name in (*RECORD_OVERRIDES, NOISE_STD)}


class _TaskVectorMethod(GroupMergeMethod):
    """Shared plumbing: spec with a required base, per-input record overrides, finite-output check."""

    name: str
    pretty_name: str
    reference_url: str | None

    def __init__(self, shared: tuple[ParameterSpec, ...], per_input: tuple[ParameterSpec, ...] = ()) -> None:
        self.spec = MergeMethodSpec(
            name=self.name,
            pretty_name=self.pretty_name,
            reference_url=self.reference_url,
            parameters=shared + per_input + _per_input_specs(),
            contract=InputContract(base=BasePolicy.REQUIRED),
        )

    def check_settings(self, shared: Mapping[str, Any]) -> None:
        """Refuse shared YAML settings the method parses but does not accept (before anything is written)."""

    @abstractmethod
    def needs_noise(self, shared: Mapping[str, Any], per_model: Mapping[str, Any]) -> bool:
        """Whether an input with these per-model YAML settings must have a privacy record."""

    def merge_group(self, group: TensorGroup, /, **parameters: Any) -> torch.Tensor:
        base = group.base.tensor
        if not group.non_base:
            return base
        name = group.metadata.name or "tensor"
        # NaN/inf inputs make the merge fail or its output non-finite: check the output, then find the input
        try:
            merged = self.merge(name, base, group.non_base, parameters)
        except ValueError:
            self._check_inputs(name, group)
            raise
        if not bool(torch.isfinite(merged).all()):
            self._check_inputs(name, group)
            raise ValueError(f"{self.spec.name}: {name}: the merge produced NaN or infinite values")
        return merged

    @staticmethod
    def _check_inputs(name: str, group: TensorGroup) -> None:
        for entry in group.entries:
            check_finite(name, entry.id, entry.tensor)

    @abstractmethod
    def merge(
        self, name: str, base: torch.Tensor, entries: tuple[TensorEntry, ...], parameters: Mapping[str, Any]
    ) -> torch.Tensor:
        """The merged tensor from the base and the non-base entries (all finite, same shape)."""


class CauchyPoEMethod(_TaskVectorMethod):
    """Heavy-tailed product-of-experts MAP merge (:mod:`hf_dpmerge.merging.methods.cauchy_poe`)."""

    name = "cauchy_poe"
    pretty_name = "Cauchy product-of-experts"
    reference_url = "https://arxiv.org/abs/2607.01689"

    def __init__(self) -> None:
        super().__init__(
            (
                _shared("lambda", float, MISSING),
                _shared("tol", Positive, 1e-2),
                _shared("jitter", Positive, 1e-3),
                _shared("max_iter", Annotated[int, Field(ge=1)], 500),
                _shared("conv_tol", NonNegative, 1e-6),  # relative change of α
                _shared("dp_calibrated", bool, False),
                _shared("layers", Literal["reference", "whole"], "reference"),
            )
        )

    def needs_noise(self, shared: Mapping[str, Any], per_model: Mapping[str, Any]) -> bool:
        return bool(shared.get("dp_calibrated", False)) and NOISE_STD not in {**shared, **per_model}

    def merge(
        self, name: str, base: torch.Tensor, entries: tuple[TensorEntry, ...], parameters: Mapping[str, Any]
    ) -> torch.Tensor:
        variances = None
        if parameters["dp_calibrated"]:
            variances = [
                float(torch.as_tensor(input_noise_variance(
                    e.id, name, _overrides(parameters, e.id), e.tensor.float() - base.float())).mean())
                for e in entries
            ]
        return cauchy_poe_merge(
            base,
            [entry.tensor for entry in entries],
            lam=parameters["lambda"],
            tol=parameters["tol"],
            jitter=parameters["jitter"],
            max_iter=parameters["max_iter"],
            conv_tol=parameters["conv_tol"],
            noise_variance=variances,
            name=name,
            layers=parameters["layers"],
            factors=_lora_deltas(name, entries),
        )


def _lora_deltas(name: str, entries: tuple[TensorEntry, ...]) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """Every input's task vector for this tensor as LoRA factors (L, R), or None unless all inputs have them."""
    factors = [input_lora_factors(entry.id, name) for entry in entries]
    return None if any(f is None for f in factors) else [f.delta_factors() for f in factors]


class DPAwareMethod(_TaskVectorMethod):
    """SURE-denoised, noise-calibrated task arithmetic (:mod:`hf_dpmerge.merging.methods.dp_aware`)."""

    name = "dp_aware"
    pretty_name = "DP-aware (SURE-denoised task arithmetic)"
    reference_url = None

    def __init__(self) -> None:
        super().__init__(
            (
                _shared("lambda", float, MISSING),
                _shared("consensus", Literal["none", "precision_sign"], "none"),
                _shared("weighting", Literal["task_arithmetic", "random_effects"], "task_arithmetic"),
                _shared("shrinkage", Literal["scale", "soft_threshold"], "scale"),
                _shared("noise", Literal["record", "estimate"], "record"),  # "estimate" is refused: see check_settings
                _shared(ALLOW_NON_PRIVATE, bool, False),
            ),
            (ParameterSpec("weight", float, ParameterScope.NON_BASE, default=1.0),),
        )

    def needs_noise(self, shared: Mapping[str, Any], per_model: Mapping[str, Any]) -> bool:
        return NOISE_STD not in {**shared, **per_model}

    def check_settings(self, shared: Mapping[str, Any]) -> None:
        if shared.get("noise", "record") != "record":
            raise ValueError(
                f"dp_aware: `noise: {shared['noise']}` is not supported: estimating the noise from the weights "
                "treats a dense task vector as noise (it zeroed 94 % of a clean LoRA delta); delete the `noise` "
                "key and give every input its dp_privacy.json or a per-model `noise_std`"
            )

    def merge(
        self, name: str, base: torch.Tensor, entries: tuple[TensorEntry, ...], parameters: Mapping[str, Any]
    ) -> torch.Tensor:
        self.check_settings(parameters)
        for entry in entries:
            require_private(self.spec.name, entry.id, parameters[ALLOW_NON_PRIVATE])
        variances, denoised = [], []
        for entry in entries:
            overrides = _overrides(parameters, entry.id)
            lora = input_lora_noise(entry.id, name, overrides)
            if lora is None:
                variances.append(input_noise_variance(entry.id, name, overrides, entry.tensor.float() - base.float()))
                denoised.append(None)
                continue
            factors, variance_a, variance_b = lora
            variances.append(factor_noise_variance(factors, variance_a, variance_b))
            denoised.append(None if parameters["shrinkage"] == "scale" else lora_factor_estimate(
                factors.lora_a, factors.lora_b, factors.scaling, variance_b, factors.fan_in_fan_out
            ))  # the scale needs only Σ Var(ΔW_ij): the dense delta's, exactly
        return dp_aware_merge(
            base,
            [entry.tensor for entry in entries],
            variances,
            weights=[parameters["weight"][entry.id] for entry in entries],
            lam=parameters["lambda"],
            consensus=parameters["consensus"],
            weighting=parameters["weighting"],
            denoised=denoised,
            shrinkage=parameters["shrinkage"],
        )


class _SpectralMethod(_TaskVectorMethod):
    """The spectral merges: τ_i exactly from an input's LoRA factors when it has them (else W_i − W_0), each
    task's spectrum truncated at its noise edge with ``noise_floor: record``
    (:func:`~hf_dpmerge.merging.inputs.input_noise_edge`), matrices merged by the method's kernel
    (:data:`~hf_dpmerge.merging.adapters.factor_space.SPECTRAL_KERNELS`, given its ``own`` settings),
    1-D tensors and embeddings by task arithmetic as the papers do (λ·mean, or λ·Σ where ``fallback_sum``).
    ``lambda`` defaults to the papers' scale, 1."""

    fallback_sum = False

    def __init__(self, *own: ParameterSpec) -> None:
        self.own = tuple(spec.name for spec in own)
        noise_floor = _shared("noise_floor", Literal["none", "record"], "none")
        super().__init__((_shared("lambda", float, 1.0), *own, noise_floor))

    def needs_noise(self, shared: Mapping[str, Any], per_model: Mapping[str, Any]) -> bool:
        return shared.get("noise_floor", "none") == "record" and NOISE_STD not in {**shared, **per_model}

    def merge(
        self, name: str, base: torch.Tensor, entries: tuple[TensorEntry, ...], parameters: Mapping[str, Any]
    ) -> torch.Tensor:
        base_c = base if base.dtype == torch.float64 else base.float()
        if not merged_as_matrix(name, base.shape):  # one task vector at a time: no N copies of an embedding
            total = sum(entry.tensor.to(base_c.dtype) - base_c for entry in entries)
            scale = parameters["lambda"] / (1 if self.fallback_sum else len(entries))
            return (base_c + scale * total).to(base.dtype)
        task_vectors: list[TaskVector] = []
        edges: list[float] | None = [] if parameters["noise_floor"] == "record" else None
        for entry in entries:
            factors = input_lora_factors(entry.id, name)
            dense = entry.tensor.to(base_c.dtype) - base_c
            if factors is None and not bool(dense.any()):
                continue  # τ_i = 0 (a weight the adapter leaves alone) changes no method's merge
            task_vectors.append(dense if factors is None else tuple(f.to(base.device) for f in factors.delta_factors()))
            if edges is not None:
                edges.append(input_noise_edge(entry.id, name, _overrides(parameters, entry.id), dense))
        if not task_vectors:
            return base
        own = {key: parameters[key] for key in self.own}
        merged = SPECTRAL_KERNELS[self.name](task_vectors, edges=edges, **own)
        return (base_c + parameters["lambda"] * merged.to(base_c.dtype)).to(base.dtype)


class TSVMethod(_SpectralMethod):
    """TSV-Merge (:mod:`hf_dpmerge.merging.methods.tsv`)."""

    name = "tsv"
    pretty_name = "TSV-Merge (task singular vectors)"
    reference_url = "https://arxiv.org/abs/2412.00081"

    def __init__(self) -> None:
        super().__init__(_shared("k", Optional[Annotated[int, Field(ge=1)]], None))  # None: ⌊R/T⌋


class IsoCMethod(_SpectralMethod):
    """Iso-C (:mod:`hf_dpmerge.merging.methods.iso`)."""

    name = "iso_c"
    pretty_name = "Iso-C (isotropic merging in the common subspace)"
    reference_url = "https://arxiv.org/abs/2502.04959"


class IsoCTSMethod(_SpectralMethod):
    """Iso-CTS (:mod:`hf_dpmerge.merging.methods.iso`)."""

    name = "iso_cts"
    pretty_name = "Iso-CTS (isotropic merging in common and task-specific subspaces)"
    reference_url = "https://arxiv.org/abs/2502.04959"

    def __init__(self) -> None:
        super().__init__(_shared("common_space_fraction", Annotated[float, Field(gt=0, le=1)], 0.8))


class WUDIMethod(_SpectralMethod):
    """WUDI-Merging (:mod:`hf_dpmerge.merging.methods.wudi`); 1-D tensors keep its start, the task-arithmetic sum."""

    name = "wudi"
    pretty_name = "WUDI-Merging (interference guided by the task vectors)"
    reference_url = "https://arxiv.org/abs/2503.08099"
    fallback_sum = True

    def __init__(self) -> None:
        super().__init__(
            _shared("steps", Annotated[int, Field(ge=0)], 300),
            _shared("lr", Positive, 1e-5),
            _shared("solver", Solver, "adam"),
        )


class EMRMethod(_TaskVectorMethod):
    """EMR-Merging's elected root W_0 + λ·τ_uni (:mod:`hf_dpmerge.merging.methods.emr`), every tensor elementwise;
    τ_i exactly from an input's LoRA factors when it has them (else W_i − W_0). Its per-task masks and rescalers
    are added where the root meets the tasks' heads: ``hf-dpmerge evaluate`` and ``push``."""

    name = "emr"
    pretty_name = "EMR-Merging (elect, mask, rescale)"
    reference_url = "https://arxiv.org/abs/2405.17461"

    def __init__(self) -> None:
        super().__init__((_shared("lambda", float, 1.0),))

    def needs_noise(self, shared: Mapping[str, Any], per_model: Mapping[str, Any]) -> bool:
        return False

    def merge(
        self, name: str, base: torch.Tensor, entries: tuple[TensorEntry, ...], parameters: Mapping[str, Any]
    ) -> torch.Tensor:
        task_vectors = []
        for entry in entries:
            factors = input_lora_factors(entry.id, name)
            if factors is not None:
                left, right = (f.double().to(base.device) for f in factors.delta_factors())
                task_vectors.append(left @ right)
            elif bool((entry.tensor != base).any()):  # τ_i = 0 (a weight no adapter touches) elects nothing
                task_vectors.append(entry.tensor.double() - base.double())
        if not task_vectors:
            return base
        return (base.double() + parameters["lambda"] * emr_elect(task_vectors)).to(base.dtype)


METHODS: tuple[_TaskVectorMethod, ...] = (
    CauchyPoEMethod(), DPAwareMethod(), TSVMethod(), IsoCMethod(), IsoCTSMethod(), WUDIMethod(), EMRMethod(),
)
_known = {method.spec.name for method in registered_methods()}
for _method in METHODS:
    if _method.spec.name not in _known:
        register(_method)
