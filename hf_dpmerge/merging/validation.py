"""Checks of a merge configuration before anything is written.

mergekit drops unknown YAML keys silently, so :func:`check_parameter_keys` rejects them; :func:`check_inputs` checks
every input: directories exist, adapters are plain LoRA, shapes match the base, no weight is NaN or infinite, every
adapter is applied to the merge base's weights (no mixed bases), records parse and stay valid under the per-model
overrides, each adapter's record is its own, and each record's base fingerprint matches the merge base. For
mergekit's own methods :func:`check_recorded_bases` checks that last point alone.
"""

from __future__ import annotations

import difflib
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from mergekit.common import ModelReference
from mergekit.config import MergeConfiguration
from mergekit.io.lazy_tensor_loader import LazyTensorLoader

from hf_dpmerge.merging.inputs import (
    adapter_weights,
    apply_overrides,
    check_finite,
    input_directory,
    input_record,
    input_settings,
    missing_record,
    record_overrides,
)
from hf_dpmerge.records.fingerprint import directory_fingerprint
from hf_dpmerge.records.record import PRIVACY_RECORD_NAME, PrivacyRecord, PrivacyRecordError
from hf_dpmerge.utils.io import is_hub_repo_id, require_model_source


def _shared_settings(config: MergeConfiguration) -> Iterator[dict[str, Any]]:
    yield config.parameters or {}
    for module in (config.modules or {}).values():
        yield module.parameters or {}
        for output_slice in module.slices or []:
            yield output_slice.parameters or {}
    for output_slice in config.slices or []:
        yield output_slice.parameters or {}


def _unknown_keys(settings: Mapping[str, Any], known: set[str]) -> str:
    unknown = sorted(set(settings) - known)
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, known, 1)
        hints.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    return ", ".join(hints)


def check_parameter_keys(config: MergeConfiguration, shared: set[str], per_input: set[str]) -> None:
    """Reject YAML parameter keys the method does not have (mergekit would ignore them silently)."""
    for settings in _shared_settings(config):
        if unknown := _unknown_keys(settings, shared | per_input):
            known = sorted(shared | per_input)
            raise ValueError(f"{config.merge_method}: unknown parameter {unknown}; known: {known}")
    for reference, settings, _ in input_settings(config):
        if unknown := _unknown_keys(settings, per_input):
            raise ValueError(
                f"{config.merge_method}: input {reference} has unknown per-model parameter {unknown}; "
                f"per-model keys are {sorted(per_input)}"
            )


def _check_same_base(reference: ModelReference, base_dir: str) -> None:
    """A ``model+adapter`` input must apply its adapter to the merge base's weights (one base per merge)."""
    model_dir = reference.model.path
    if os.path.realpath(model_dir) == os.path.realpath(base_dir):
        return
    names = sorted(adapter_weights(reference.lora.path).factors)
    if directory_fingerprint(model_dir, names) != directory_fingerprint(base_dir, names):  # missing ones differ too
        raise ValueError(
            f"input {reference} applies its adapter to {model_dir}, but the merge base is {base_dir} and the "
            "weights the adapter modifies differ: mixed base models in one merge; give every input the merge base"
        )


def _with_overrides(reference: ModelReference, record: PrivacyRecord, settings: Mapping[str, Any]) -> PrivacyRecord:
    """The record as the merge will use it: per-model YAML values in place, still valid."""
    overrides = record_overrides(settings)
    try:
        return apply_overrides(record, overrides)
    except (PrivacyRecordError, TypeError) as err:
        raise PrivacyRecordError(f"input {reference}: its per-model parameters {overrides} give {err}") from None


def _check_record_matches_adapter(reference: ModelReference, record: PrivacyRecord) -> None:
    """The weights the record's base fingerprint covers are those the adapter's LoRA layers modify."""
    if not record.base_model_hash_tensors:
        return
    adapter = adapter_weights(reference.lora.path)
    covered = set(record.base_model_hash_tensors)
    unrecorded = sorted(set(adapter.factors) - covered)
    foreign = sorted(covered - set(adapter.factors) - set(adapter.trained))
    if unrecorded or foreign:
        raise PrivacyRecordError(
            f"input {reference}: its {PRIVACY_RECORD_NAME} does not belong to this adapter: the adapter modifies "
            f"{unrecorded} that the record does not cover, and the record covers {foreign} that the adapter "
            "does not modify; copy the record that training saved with this adapter"
        )


def _check_fingerprint(reference: ModelReference, record: PrivacyRecord, base_dir: str) -> None:
    if not record.base_model_hash or not record.base_model_hash_tensors:
        warnings.warn(f"input {reference}: its privacy record has no base fingerprint; base not checked", stacklevel=2)
        return
    actual = directory_fingerprint(base_dir, record.base_model_hash_tensors)
    if actual != record.base_model_hash:
        raise ValueError(
            f"input {reference} was trained on another base model: its privacy record's base_model_hash "
            f"{record.base_model_hash} does not match {base_dir} {actual}; merge adapters trained from this base"
        )


def _record_base(reference: ModelReference, base: ModelReference | None) -> str | None:
    """The base directory an input's record must match: the merge base, else (no ``base_model``) the model a
    ``base+adapter`` input applies its adapter to; None where there is none to check against."""
    target = base if base is not None else ModelReference(model=reference.model) if reference.lora else None
    if target is None or target.lora:
        return None
    require_model_source(target.model.path, "base model")
    return target.local_path()


def check_local_paths(config: MergeConfiguration) -> None:
    """Every input path that cannot be a Hub id is a folder (:func:`~hf_dpmerge.utils.io.require_model_source`), so a
    missing run is named, whatever the method, instead of being reported as a malformed Hub id."""
    for reference in [config.base_model, *(reference for reference, _, _ in input_settings(config))]:
        if not isinstance(reference, ModelReference):
            continue
        what = "base model" if reference == config.base_model else "merge input"
        for path in (reference.model.path, reference.lora.path if reference.lora else None):
            if path is not None and not is_hub_repo_id(path):
                require_model_source(path, what)


def check_recorded_bases(config: MergeConfiguration) -> None:
    """Every local input that carries a privacy record was trained on the merge base (its recorded base fingerprint,
    :func:`_check_fingerprint`): what ``hf-dpmerge merge`` checks for mergekit's own methods, whose other checks
    stay mergekit's (:func:`check_inputs` checks it for ours, with the rest). Hub inputs are left to mergekit."""
    for reference, _, base in input_settings(config):
        directory = input_directory(reference)
        if reference == base or directory is None or not directory.is_dir():
            continue
        record = input_record(reference)
        if record is not None and (base_dir := _record_base(reference, base)) is not None:
            _check_fingerprint(reference, record, base_dir)


def _check_weights(reference: ModelReference, base_shapes: Mapping[str, tuple[int, ...]]) -> None:
    if reference.lora:
        adapter = adapter_weights(reference.lora.path)
        for key, tensor in adapter.tensors.items():
            check_finite(key, reference, tensor)
        for name, factor in adapter.factors.items():
            rows, cols = factor.lora_b.shape[0], factor.lora_a.shape[1]
            shape = (cols, rows) if factor.fan_in_fan_out else (rows, cols)
            if base_shapes.get(name, shape) != shape:
                raise ValueError(
                    f"{name}: input {reference} has a LoRA delta of shape {shape}, base {base_shapes[name]}"
                )
        return
    model = LazyTensorLoader.from_disk(reference.model.path)
    for name in model.index.tensor_paths:
        tensor = model.get_tensor(name)
        if base_shapes.get(name, tuple(tensor.shape)) != tuple(tensor.shape):
            raise ValueError(f"{name}: input {reference} has shape {tuple(tensor.shape)}, base {base_shapes[name]}")
        if tensor.is_floating_point():
            check_finite(name, reference, tensor)


def check_inputs(
    config: MergeConfiguration, needs_noise: Callable[[Mapping[str, Any]], bool], lora_cache: str | None
) -> None:
    """Check every non-base input before merging (raising on the first problem).

    ``needs_noise(per_model_parameters)`` says whether the method needs that input's noise model.
    """
    shapes: dict[str, dict[str, tuple[int, ...]]] = {}
    for reference, settings, base in input_settings(config):
        if base is None or reference == base:
            continue
        if base.lora:
            raise ValueError(f"base model {base} must be a plain model, not base+adapter")
        require_model_source(base.model.path, "base model")
        base_dir = base.local_path()
        record = input_record(reference)
        if record is None and needs_noise(settings):
            raise missing_record(reference)
        if reference.lora and not os.path.isdir(reference.model.path):
            raise FileNotFoundError(f"input {reference}: model directory {reference.model.path} does not exist")
        if reference.lora and not lora_cache:
            raise ValueError(f"input {reference} is base+adapter: pass --lora-merge-cache DIR")
        if base_dir not in shapes:
            loader = LazyTensorLoader.from_disk(base_dir)
            shapes[base_dir] = {name: tuple(loader.get_tensor(name).shape) for name in loader.index.tensor_paths}
        _check_weights(reference, shapes[base_dir])
        if reference.lora:
            _check_same_base(reference, base_dir)
        if record is not None:
            checked = _with_overrides(reference, record, settings)
            if reference.lora:
                _check_record_matches_adapter(reference, checked)
            _check_fingerprint(reference, checked, base_dir)
