"""What the merge kernels know about each input besides its tensors: its privacy record and LoRA factors.

mergekit hands a kernel one output tensor at a time, each input identified by its ``ModelReference`` (or,
through ``mergekit.merge_methods.api.merge_state_dicts``, by an in-memory id with no files and no record).
The record is found beside the adapter (``base+adapter``: ``adapter/dp_privacy.json``) or the full model
(``model/dp_privacy.json``). Per-model YAML ``parameters:`` may override the noise model's record values
(:data:`RECORD_OVERRIDES`, never ε/δ) or give the task vector's noise directly (``noise_std``). mergekit drops
unknown YAML keys silently, so :func:`check_parameter_keys` rejects them; :func:`check_inputs` checks every
input before anything is written: directories exist, adapters are plain LoRA, shapes match the base, no
weight is NaN or infinite, every adapter is applied to the merge base's weights (no mixed bases), records
parse and stay valid under the per-model overrides, each adapter's record is its own, and each record's base
fingerprint matches the merge base.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import os
import shutil
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from mergekit.common import ModelReference
from mergekit.config import MergeConfiguration
from mergekit.io.lazy_tensor_loader import LazyTensorLoader

from hf_dpmerge.data.model_path import require_model_source
from hf_dpmerge.merging.noise_variance import lora_noise_variance, parameter_noise_variance
from hf_dpmerge.privacy.fingerprint import base_fingerprint, directory_base_tensors
from hf_dpmerge.privacy.record import PRIVACY_RECORD_NAME, PrivacyRecord, PrivacyRecordError

NOISE_STD = "noise_std"
_OPTIMIZER_KEYS: dict[str, type] = {"name": str, "lr": float, "momentum": float, "weight_decay": float}
_ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."
_MAD_TO_STD = 0.6744897501960817


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


def _stamp(path: Path) -> tuple[int, int]:
    """Cache key part that changes when the file is rewritten."""
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=None)
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


@dataclasses.dataclass(frozen=True)
class LoraFactors:
    """One LoRA layer: ΔW = scaling·B·A, transposed into the weight's layout when ``fan_in_fan_out``."""

    lora_a: torch.Tensor
    lora_b: torch.Tensor
    scaling: float
    fan_in_fan_out: bool

    def noise_variance(self, factor_variance: float) -> torch.Tensor:
        variance = lora_noise_variance(self.lora_a, self.lora_b, self.scaling, factor_variance)
        return variance.T if self.fan_in_fan_out else variance


@dataclasses.dataclass(frozen=True)
class AdapterWeights:
    """What a saved peft adapter changes, by base weight name: LoRA layers, and fully trained weights
    (``modules_to_save`` heads, other PEFT parameters). Everything else stayed frozen, so carries no noise."""

    factors: dict[str, LoraFactors]
    trained: frozenset[str]
    tensors: dict[str, torch.Tensor]


def adapter_weights(adapter_dir: str | Path) -> AdapterWeights:
    """The adapter saved in ``adapter_dir`` (cached until its weights file changes)."""
    directory = Path(adapter_dir)
    if not (directory / _ADAPTER_WEIGHTS).exists():
        raise FileNotFoundError(f"no {_ADAPTER_WEIGHTS} in {directory}")
    return _load_adapter(str(directory), _stamp(directory / _ADAPTER_WEIGHTS))


@functools.lru_cache(maxsize=None)
def _load_adapter(adapter_dir: str, _stamp: tuple[int, int]) -> AdapterWeights:
    from peft.utils.other import get_pattern_key
    from safetensors.torch import load_file

    directory = Path(adapter_dir)
    config = json.loads((directory / "adapter_config.json").read_text())
    if config.get("peft_type") != "LORA" or config.get("use_dora"):
        kind = "a DoRA adapter (use_dora: true)" if config.get("use_dora") else f"a {config.get('peft_type')} adapter"
        raise ValueError(
            f"{directory} is {kind}: cauchy_poe and dp_aware support plain LoRA adapters only (their task "
            "vector s·B·A and its noise model)"
        )
    tensors = load_file(directory / _ADAPTER_WEIGHTS)
    factors, trained = {}, set()
    for key, value in tensors.items():
        module = key.removeprefix(_PEFT_PREFIX).rsplit(".", 1)[0]
        if ".lora_A." in key:
            module = module.removesuffix(".lora_A")
            patterns = config.get("alpha_pattern") or {}
            alpha = float(patterns.get(get_pattern_key(patterns, module), config["lora_alpha"]))
            rank = value.shape[0]
            scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
            lora_b = tensors[key.replace(".lora_A.", ".lora_B.")]
            factors[f"{module}.weight"] = LoraFactors(value, lora_b, scaling, bool(config.get("fan_in_fan_out")))
        elif ".lora_B." not in key:
            trained.add(f"{module.split('.lora_')[0].replace('.modules_to_save.default', '')}.weight")
    return AdapterWeights(factors, frozenset(trained), tensors)


def _missing_record(reference: Any, alternative: str = "") -> PrivacyRecordError:
    directory = input_directory(reference)
    where = f"in {directory}" if directory is not None else "(an in-memory input carries no record)"
    return PrivacyRecordError(
        f"input {reference}: no {PRIVACY_RECORD_NAME} {where}; train it with "
        f"DPSAMTrainer, give the input's noise_std {alternative}".rstrip()
    )


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
    reference: ModelReference,
    tensor_name: str,
    overrides: Mapping[str, Any],
    estimate_from: torch.Tensor | None = None,
) -> torch.Tensor | float:
    """s² of the DP noise in one input's task vector for one tensor (a scalar or a per-coordinate map).

    Order: the per-model ``noise_std``; the record (with overrides) through the optimizer formula, or for
    a LoRA adapter the factor formula for weights its LoRA layers modify and 0 for weights it leaves
    frozen; without a record, a robust MAD
    estimate (median |τ − median τ| / 0.6745)² from the task vector ``estimate_from`` if given; else an error.
    """
    values = {key: value for key, value in overrides.items() if value is not None}
    if values.get(NOISE_STD) is not None:
        return float(values.pop(NOISE_STD)) ** 2
    record = input_record(reference)
    if record is None:
        if estimate_from is None:
            raise _missing_record(reference, "or set `noise: estimate`")
        warnings.warn(f"input {reference} has no privacy record: estimating its noise from the weights")
        deviation = (estimate_from - estimate_from.median()).abs().median()
        return float(deviation / _MAD_TO_STD) ** 2
    variance = parameter_noise_variance(apply_overrides(record, values))
    if not reference.lora or variance == 0:
        return variance
    adapter = adapter_weights(input_directory(reference))
    if tensor_name in adapter.factors:
        return adapter.factors[tensor_name].noise_variance(variance)
    return variance if tensor_name in adapter.trained else 0.0


def check_finite(tensor_name: str, reference: ModelReference, tensor: torch.Tensor) -> None:
    """Raise naming the tensor and input when a weight holds NaN or inf."""
    if not bool(torch.isfinite(tensor).all()):
        raise ValueError(f"{tensor_name}: input {reference} holds NaN or infinite values")


# ---- checks before merging -------------------------------------------------------------------------


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
    try:
        same = base_fingerprint(directory_base_tensors(model_dir, names)) == base_fingerprint(
            directory_base_tensors(base_dir, names)
        )
    except KeyError:
        same = False
    if not same:
        raise ValueError(
            f"input {reference} applies its adapter to {model_dir}, but the merge base is {base_dir} and the "
            "weights the adapter modifies differ: mixed base models in one merge; give every input the merge base"
        )


def _with_overrides(reference: ModelReference, record: PrivacyRecord, settings: Mapping[str, Any]) -> PrivacyRecord:
    """The record as the merge will use it: per-model YAML values in place, still valid."""
    overrides = {k: v for k, v in settings.items() if k in RECORD_OVERRIDES and v is not None}
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
    foreign = sorted(covered - set(adapter.factors) - adapter.trained)
    if unrecorded or foreign:
        raise PrivacyRecordError(
            f"input {reference}: its {PRIVACY_RECORD_NAME} does not belong to this adapter: the adapter modifies "
            f"{unrecorded} that the record does not cover, and the record covers {foreign} that the adapter "
            "does not modify; copy the record that training saved with this adapter"
        )


def _check_fingerprint(reference: ModelReference, record: PrivacyRecord, base_dir: str) -> None:
    if not record.base_model_hash or not record.base_model_hash_tensors:
        warnings.warn(f"input {reference}: its privacy record has no base fingerprint; base not checked")
        return
    try:
        actual = base_fingerprint(directory_base_tensors(base_dir, record.base_model_hash_tensors))
    except KeyError as err:
        actual = f"(missing tensors: {err})"
    if actual != record.base_model_hash:
        raise ValueError(
            f"input {reference} was trained on another base model: its privacy record's base_model_hash "
            f"{record.base_model_hash} does not match {base_dir} {actual}; merge adapters trained from this base"
        )


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


def _complete_model_dir(directory: Path) -> bool:
    """config.json, every shard the index names, and each safetensors file whole (a killed write is not)."""
    from safetensors import SafetensorError, safe_open

    index = directory / "model.safetensors.index.json"
    if index.exists():
        shards = [directory / name for name in set(json.loads(index.read_text())["weight_map"].values())]
    else:
        shards = list(directory.glob("*.safetensors"))
    if not (directory / "config.json").exists() or not shards or not all(s.exists() for s in shards):
        return False
    for shard in shards:
        try:
            with safe_open(shard, "pt"):
                pass
        except SafetensorError:
            return False
    return True


def drop_stale_lora_merges(config: MergeConfiguration, cache_dir: str) -> None:
    """Drop ``--lora-merge-cache`` entries older than their inputs, or incomplete, so mergekit rebuilds them.

    mergekit keys each base+adapter merge by path only: an adapter retrained in place would otherwise be
    merged in its old state.
    """
    for reference in config.referenced_models():
        if not reference.lora:
            continue
        entry = Path(cache_dir) / f"{reference.model._unique_id()}_{reference.lora._unique_id()}"
        if not entry.is_dir():
            continue
        sources = [f for d in (reference.model.path, reference.lora.path) if os.path.isdir(d)
                   for f in Path(d).iterdir() if f.is_file()]
        built = [f.stat().st_mtime_ns for f in entry.iterdir() if f.suffix == ".safetensors"]
        stale = any(f.stat().st_mtime_ns > min(built) for f in sources) if built else True
        if stale or not _complete_model_dir(entry):
            warnings.warn(f"{entry}: stale or incomplete LoRA merge cache entry for {reference}; rebuilding it")
            shutil.rmtree(entry)


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
            raise _missing_record(reference)
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
