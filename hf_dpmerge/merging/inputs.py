"""What the merge kernels know about each input besides its tensors: its privacy record, noise statistics and
LoRA factors.

mergekit hands a kernel one output tensor at a time, each input identified by its ``ModelReference`` (or,
through ``mergekit.merge_methods.api.merge_state_dicts``, by an in-memory id with no files and no record).
The record is found beside the adapter (``base+adapter``: ``adapter/dp_privacy.json``) or the full model
(``model/dp_privacy.json``). Per-model YAML ``parameters:`` may override the noise model's record values
(:data:`RECORD_OVERRIDES`, never ε/δ) or give the task vector's noise directly (``noise_std``). The checks
before a merge are :mod:`.validation`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from mergekit.common import ModelPath, ModelReference
from mergekit.config import MergeConfiguration

from hf_dpmerge.lora import LoraFactor, SavedAdapter, UnsupportedAdapterError, load_saved_adapter
from hf_dpmerge.noise.floor import lora_noise_edge, noise_edge
from hf_dpmerge.noise.variance import (
    alignment_restoring,
    capped_variance,
    lora_noise_variance,
    record_noise_variance,
    stats_noise_variance,
)
from hf_dpmerge.records.noise_record import NOISE_STATS_NAME, NoiseStats
from hf_dpmerge.records.record import PRIVACY_RECORD_NAME, PrivacyRecord, PrivacyRecordError
from hf_dpmerge.records.run_folders import ADAPTER_DIR, is_peft_adapter
from hf_dpmerge.utils.adapter_files import ADAPTER_SAFETENSORS_NAME

NOISE_STD = "noise_std"
_ZERO_B_INITS = (True, "gaussian")  # peft's init_lora_weights values that start B at zero
_OPTIMIZER_KEYS: dict[str, type] = {"name": str, "lr": float, "momentum": float, "weight_decay": float}


RECORD_OVERRIDES: dict[str, type] = {
    "noise_multiplier": float,
    "max_grad_norm": float,
    "expected_batch_size": int,
    "sum_lr_squared": float,
    **{f"optimizer.{key}": kind for key, kind in _OPTIMIZER_KEYS.items()},
}
"""Per-model YAML keys that replace a record value, with their types: the noise model's inputs only
(docs/design.md §6). What the record states about the guarantee (``epsilon``, ``delta``, ``dp``,
``accountant``, ``num_samples``, the base fingerprint) cannot be replaced from YAML: the card states it."""


def input_directory(reference: Any) -> Path | None:
    """Where an input's privacy record lives: the adapter directory, else the model directory; None for an
    in-memory input (``mergekit.merge_methods.api.merge_state_dicts`` ids), which has no files."""
    if not isinstance(reference, ModelReference):
        return None
    return Path(reference.lora.path if reference.lora else reference.model.path)


def adapter_input(directory: str | os.PathLike) -> ModelReference:
    """A saved adapter as a merge input outside mergekit (the factor-space merge, task similarity): a reference
    whose model and adapter are both ``directory``, so the input functions here read its weights, record and noise
    statistics from it."""
    path = ModelPath(path=str(directory))
    return ModelReference(model=path, lora=path)


def _stamp(path: Path) -> tuple[int, int]:
    """Cache key part that changes when the file is rewritten."""
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


@functools.cache
def _load_record(path: str, _stamp: tuple[int, int]) -> PrivacyRecord:
    return PrivacyRecord.load(path)


def input_record(reference: Any) -> PrivacyRecord | None:
    """The input's record, None when it has none (in-memory inputs never do); corrupt records raise
    :class:`PrivacyRecordError`."""
    directory = input_directory(reference)
    if directory is None:
        return None
    if not directory.is_dir():
        kind = "adapter" if reference.lora else "model"
        raise FileNotFoundError(f"input {reference}: {kind} directory {directory} does not exist")
    path = directory / PRIVACY_RECORD_NAME
    if not path.exists():
        return None
    return _load_record(str(path), _stamp(path))


def apply_overrides(record: PrivacyRecord, overrides: Mapping[str, Any]) -> PrivacyRecord:
    """A copy of ``record`` with per-model YAML values in place (``optimizer.<key>`` edits the dict)."""
    optimizer = dict(record.optimizer)
    top = {}
    for key, value in overrides.items():
        if key.startswith("optimizer."):
            optimizer[key.removeprefix("optimizer.")] = value
        else:
            top[key] = value
    return dataclasses.replace(record, optimizer=optimizer, **top)


def record_overrides(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The input's per-model settings that replace record values: the set ones among :data:`RECORD_OVERRIDES`."""
    return {key: value for key, value in settings.items() if key in RECORD_OVERRIDES and value is not None}


def factor_noise_variance(
    factor: LoraFactor, variance_a: torch.Tensor | float, variance_b: torch.Tensor | float
) -> torch.Tensor:
    """Per-coordinate noise variance of ``factor``'s ΔW, in the weight's layout, from its factors' variances."""
    variance = lora_noise_variance(factor.lora_a, factor.lora_b, factor.scaling, variance_a, variance_b)
    return variance.T if factor.fan_in_fan_out else variance


def adapter_weights(adapter_dir: str | Path) -> SavedAdapter:
    """The adapter saved in ``adapter_dir`` (cached until its weights file changes)."""
    directory = Path(adapter_dir)
    if not (directory / ADAPTER_SAFETENSORS_NAME).exists():
        raise FileNotFoundError(f"no {ADAPTER_SAFETENSORS_NAME} in {directory}")
    return _load_adapter(str(directory), _stamp(directory / ADAPTER_SAFETENSORS_NAME))


@functools.cache
def _load_adapter(adapter_dir: str, _stamp: tuple[int, int]) -> SavedAdapter:
    try:
        return load_saved_adapter(adapter_dir)
    except UnsupportedAdapterError as err:
        raise ValueError(
            f"{err}: hf_dpmerge's merge methods support plain LoRA adapters only (their task vector s·B·A and its "
            "noise model)"
        ) from None


def missing_record(reference: Any) -> PrivacyRecordError:
    directory = input_directory(reference)
    where = f"in {directory}" if directory is not None else "(an in-memory input carries no record)"
    return PrivacyRecordError(
        f"input {reference}: no {PRIVACY_RECORD_NAME} {where}; train it with DPSAMTrainer, or give the input's "
        "noise_std"
    )


@functools.cache
def _load_noise_stats(path: str, _stamp: tuple[int, int]) -> NoiseStats:
    return NoiseStats.load(Path(path).parent)


def input_noise_stats(reference: ModelReference) -> NoiseStats | None:
    """The input's ``dp_noise_stats.safetensors`` (beside its record), None when it ships none."""
    directory = input_directory(reference)
    if directory is None:
        return None
    path = directory / NOISE_STATS_NAME
    return _load_noise_stats(str(path), _stamp(path)) if path.exists() else None


def _parameter_variance(
    reference: ModelReference, record: PrivacyRecord, saved_name: str, head: bool = False,
    factor: LoraFactor | None = None,
) -> torch.Tensor | float:
    """s² of one saved tensor: 0 for an A its record says was frozen (FFA-LoRA, ``extra.lora_a``: drawn from a
    public seed, never noised); from the shipped statistics (0 for a tensor they do not list: it was frozen; a
    ``factor`` of a LoRA layer adds the alignment penalty's restoring force), else the record's formula (warned)."""
    if ".lora_A." in saved_name and record.extra.get("lora_a"):
        return 0.0
    stats = input_noise_stats(reference)
    if stats is not None:
        restoring = 0.0 if factor is None else alignment_restoring(record, factor, saved_name)
        variance = stats_noise_variance(record, stats, saved_name, restoring)
        return 0.0 if variance is None else variance
    warnings.warn(  # one message per input: stacklevel 1 gives every call one location, shown once per message
        f"input {reference}: no {NOISE_STATS_NAME}: using the record's "
        "noise-dominated formula, which over-states the noise of informative Adam coordinates",
        stacklevel=1,
    )
    return record_noise_variance(record, head)


def _input_record(reference: ModelReference, overrides: Mapping[str, Any]) -> PrivacyRecord:
    record = input_record(reference)
    if record is None:
        raise missing_record(reference)
    return apply_overrides(record, record_overrides(overrides))


def input_lora_factors(reference: ModelReference, tensor_name: str) -> LoraFactor | None:
    """The LoRA factors of this tensor when the input is ``base+adapter`` and its adapter modifies it (mergekit's
    Python API may identify inputs by plain names: those have none)."""
    if not getattr(reference, "lora", None):
        return None
    return adapter_weights(input_directory(reference)).factors.get(tensor_name)


def _noisy_lora(
    reference: ModelReference, tensor_name: str, overrides: Mapping[str, Any]
) -> tuple[LoraFactor, PrivacyRecord] | None:
    values = {key: value for key, value in overrides.items() if value is not None}
    factors = input_lora_factors(reference, tensor_name)
    if factors is None or values.get(NOISE_STD) is not None:
        return None
    record = _input_record(reference, values)
    return (factors, record) if record.dp else None


def input_lora_noise(
    reference: ModelReference, tensor_name: str, overrides: Mapping[str, Any]
) -> tuple[LoraFactor, torch.Tensor | float, torch.Tensor | float] | None:
    """(factors, V_A, V_B) when the input's task vector for this tensor is a noisy LoRA delta s·B·A, else None
    (full models, frozen weights, heads, non-DP inputs, or a per-model ``noise_std`` for the dense delta)."""
    lora = _noisy_lora(reference, tensor_name, overrides)
    if lora is None:
        return None
    factors, record = lora
    return (factors, _parameter_variance(reference, record, factors.saved_a, factor=factors),
            _b_variance(reference, record, factors))


def input_lora_b_noise(
    reference: ModelReference, tensor_name: str, overrides: Mapping[str, Any]
) -> tuple[LoraFactor, torch.Tensor | float] | None:
    """(factors, V_B) as :func:`input_lora_noise`, without A's variance (for a frozen, noiseless A)."""
    lora = _noisy_lora(reference, tensor_name, overrides)
    if lora is None:
        return None
    factors, record = lora
    return factors, _b_variance(reference, record, factors)


def _b_variance(reference: ModelReference, record: PrivacyRecord, factors: LoraFactor) -> torch.Tensor | float:
    """V_B of the input's B: the optimiser's walk, capped by the released B where B started at zero (B̃ is then
    its task vector; docs/design.md §6)."""
    variance_b = _parameter_variance(reference, record, factors.saved_b, factor=factors)
    if adapter_weights(input_directory(reference)).config.init_lora_weights in _ZERO_B_INITS:
        variance_b = capped_variance(variance_b, factors.lora_b)
    return variance_b


def is_private(record: PrivacyRecord | None) -> bool:
    """Whether a record states a finite (ε, δ) DP guarantee (no record states none)."""
    return record is not None and record.dp and math.isfinite(record.epsilon)


def require_private(method: str, reference: Any, allow_non_private: bool) -> None:
    """Refuse an input whose privacy record states no DP guarantee, unless ``allow_non_private``."""
    if allow_non_private:
        return
    record = input_record(reference)
    if is_private(record):
        return
    if record is not None:
        why = f"its {PRIVACY_RECORD_NAME} states no guarantee (dp={record.dp}, epsilon={record.epsilon})"
    elif input_directory(reference) is None:
        why = "an in-memory input carries no record"
    else:
        why = f"it has no {PRIVACY_RECORD_NAME}"
    raise PrivacyRecordError(
        f"{method}: input {reference} is not shown to be differentially private ({why}); merging it would "
        "release a model with no privacy guarantee for its data. Set `allow_non_private: true` in the merge "
        "parameters to merge it anyway (the merged card then states no guarantee)"
    )


def input_noise_variance(
    reference: ModelReference, tensor_name: str, overrides: Mapping[str, Any], task_vector: torch.Tensor | None = None
) -> torch.Tensor | float:
    """s² of the DP noise in one input's task vector for one tensor (a scalar or a per-coordinate map).

    ``task_vector`` (W_i − W_0, when the caller has it) caps a head's or full model's s² from the record by
    its mean square (:func:`~hf_dpmerge.noise.variance.capped_variance`); LoRA B is capped by B̃ itself.

    Order: the per-model ``noise_std``; else the input's record with its per-model overrides (σ, C, B_exp and,
    for the fallback formula, ``sum_lr_squared``/``optimizer.*``) and its noise statistics
    (:mod:`~hf_dpmerge.noise.variance`): for a LoRA adapter the factor formula for weights its LoRA
    layers modify, the head's own variance for trained heads, 0 for weights it leaves frozen.
    """
    values = {key: value for key, value in overrides.items() if value is not None}
    if values.get(NOISE_STD) is not None:
        return float(values.pop(NOISE_STD)) ** 2
    record = _input_record(reference, values)
    if not record.dp:
        return 0.0
    if not reference.lora:
        variance = _parameter_variance(reference, record, tensor_name)
    elif (lora := input_lora_noise(reference, tensor_name, values)) is not None:
        return factor_noise_variance(*lora)
    elif tensor_name in (adapter := adapter_weights(input_directory(reference))).trained:
        variance = _parameter_variance(reference, record, adapter.trained[tensor_name], head=True)
    else:
        return 0.0
    return variance if task_vector is None else capped_variance(variance, task_vector)


def input_noise_edge(
    reference: ModelReference, tensor_name: str, overrides: Mapping[str, Any], task_vector: torch.Tensor
) -> float:
    """The noise floor of one input's task vector τ (W_i − W_0) for one 2-D tensor (:mod:`~hf_dpmerge.noise.floor`):
    from its factors' noise for a noisy LoRA delta (s·e(V_B, A) with A frozen), else from the per-coordinate s² of
    :func:`input_noise_variance` (a per-model ``noise_std``, heads, full models; 0 for non-DP inputs)."""
    lora = input_lora_noise(reference, tensor_name, overrides)
    if lora is not None:
        factors, variance_a, variance_b = lora
        return lora_noise_edge(factors.lora_a, factors.lora_b, factors.scaling, variance_a, variance_b)
    return noise_edge(input_noise_variance(reference, tensor_name, overrides, task_vector), tuple(task_vector.shape))


def check_finite(tensor_name: str, reference: ModelReference, tensor: torch.Tensor) -> None:
    """Raise naming the tensor and input when a weight holds NaN or inf."""
    if not bool(torch.isfinite(tensor).all()):
        raise ValueError(f"{tensor_name}: input {reference} holds NaN or infinite values")


def input_settings(
    config: MergeConfiguration,
) -> Iterator[tuple[ModelReference, dict[str, Any], ModelReference | None]]:
    """(input, its per-model parameters, its base) for every input the configuration names."""
    slices = list(config.slices or [])
    for module in (config.modules or {}).values():
        for model in module.models or []:
            yield model.model, model.parameters or {}, config.base_model
        slices.extend(module.slices or [])
    for model in config.models or []:
        yield model.model, model.parameters or {}, config.base_model
    for output_slice in slices:
        for source in output_slice.sources:
            yield source.model, source.parameters or {}, output_slice.base_model or config.base_model


def input_run(reference: Any) -> tuple[str, Path] | None:
    """(run name, ``<runs>/<name>/adapter``) of an adapter input laid out as training writes it
    (``<runs>/<name>/encoder_adapter`` or ``…/adapter`` merged, ``<runs>/<name>/adapter`` holding the task's head
    and privacy record); None for any other input."""
    if not isinstance(reference, ModelReference) or not reference.lora:
        return None
    run = Path(reference.lora.path).parent
    adapter = run / ADAPTER_DIR
    return (run.name, adapter) if is_peft_adapter(adapter) and (adapter / PRIVACY_RECORD_NAME).is_file() else None


def task_adapters(config: MergeConfiguration) -> dict[str, Path]:
    """Task → adapter directory, for the inputs laid out as training writes them (:func:`input_run`)."""
    found: dict[str, Path] = {}
    for reference, _, base in input_settings(config):
        if reference != base and (run := input_run(reference)) is not None:
            found.setdefault(*run)
    return found
