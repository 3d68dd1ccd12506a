"""Merge LoRA adapters that share every A into one LoRA adapter of the same rank (docs/design.md §15.2).

The inputs are encoder adapters (``encoder_adapter/``: LoRA weights only, no task head; each task keeps its own
head) trained with ``--lora_freeze_a``: their privacy records state the A factors' ``extra.lora_a =
{seed, fingerprint}``. The merged adapter keeps that A and gets B from :mod:`.factor_space`, so it is exactly the
dense merge's task vector at adapter size, loads with stock ``peft.PeftModel.from_pretrained`` and can be merged
again. An input without a recorded fingerprint trained its A: factor-space merging would not be exact and is
refused. The merge is post-processing, not a training run, so the output has no ``dp_privacy.json``: it keeps
its inputs' records in ``adapter_merge.json`` (read when it is merged again) and states their composed
guarantee in its README.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import save_file

from hf_dpmerge.lora import SavedAdapter
from hf_dpmerge.merging.adapters.factor_space import (
    FACTOR_METHODS,
    SPECTRAL_METHODS,
    cauchy_poe_lora_b,
    merged_lora_b,
    safe_merge_lora_b,
    spectral_lora_b,
)
from hf_dpmerge.merging.inputs import (
    NOISE_STD,
    adapter_input,
    adapter_weights,
    input_lora_b_noise,
    require_private,
)
from hf_dpmerge.merging.run import MERGE_MARKER, check_merge_output
from hf_dpmerge.noise.floor import lora_noise_edge
from hf_dpmerge.records.card import CARD_NAME, merged_adapter_card
from hf_dpmerge.records.fingerprint import base_fingerprint
from hf_dpmerge.records.record import PRIVACY_RECORD_NAME, PrivacyRecord
from hf_dpmerge.records.run_folders import ADAPTER_DIR, ENCODER_ADAPTER_DIR
from hf_dpmerge.utils.adapter_files import ADAPTER_CONFIG_NAME, ADAPTER_SAFETENSORS_NAME, without_peft_prefix
from hf_dpmerge.utils.io import staged_directory

MERGE_RECORD_NAME = "adapter_merge.json"
_RETRAIN = "use the dense merge (hf-dpmerge merge without --as-adapter) or retrain with --lora_freeze_a true"


@dataclass(frozen=True)
class AdapterInput:
    """One input adapter: its directory, weight w_i and per-model record overrides (``dp_aware``'s noise model)."""

    directory: Path
    weight: float = 1.0
    overrides: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Loaded:
    source: AdapterInput
    adapter: SavedAdapter
    records: dict[str, PrivacyRecord]  # its own record, or for a merged adapter its inputs' records
    lora_a: Mapping[str, Any] | None
    merged: bool


def saved_a_fingerprint(adapter: SavedAdapter) -> str:
    """The A fingerprint training records (``lora_a_fingerprint``) recomputed from a saved adapter's A tensors."""
    return base_fingerprint({
        without_peft_prefix(f.saved_a).replace(".lora_A.weight", ".lora_A.default.weight"): f.lora_a
        for f in adapter.factors.values()
    })


def _load(source: AdapterInput) -> _Loaded:
    directory = source.directory
    adapter = adapter_weights(directory)
    if adapter.trained:
        raise ValueError(
            f"input {directory} trains weights outside its LoRA layers ({sorted(adapter.trained)}): merge the "
            "task adapters' encoder_adapter/ exports (task heads are never merged)"
        )
    if (directory / PRIVACY_RECORD_NAME).exists():
        record = PrivacyRecord.load(directory)
        return _Loaded(source, adapter, {_input_name(directory, record): record}, record.extra.get("lora_a"),
                       merged=False)
    if (directory / MERGE_RECORD_NAME).exists():
        merge = json.loads((directory / MERGE_RECORD_NAME).read_text())
        records = {name: PrivacyRecord.from_dict(data, f"{directory / MERGE_RECORD_NAME}: {name}")
                   for name, data in merge["records"].items()}
        return _Loaded(source, adapter, records, merge["lora_a"], merged=True)
    raise ValueError(
        f"input {directory} has no {PRIVACY_RECORD_NAME} (nor {MERGE_RECORD_NAME}): nothing shows that its A is "
        f"the shared one; {_RETRAIN}"
    )


def check_shared_a(inputs: Sequence[_Loaded]) -> None:
    """Refuse inputs whose A factors are not recorded as frozen, not the recorded ones, or not all the same."""
    for item in inputs:
        fingerprint = (item.lora_a or {}).get("fingerprint")
        if not fingerprint:
            raise ValueError(
                f"input {item.source.directory}: its record has no extra.lora_a fingerprint, so its LoRA A was "
                f"trained and a factor-space merge would not be exact; {_RETRAIN}"
            )
        if saved_a_fingerprint(item.adapter) != fingerprint:
            raise ValueError(
                f"input {item.source.directory}: its saved A factors do not match its record's lora_a fingerprint "
                f"{fingerprint}; copy the record that training saved with this adapter"
            )
    first = inputs[0]
    for item in inputs[1:]:
        if item.lora_a["fingerprint"] != first.lora_a["fingerprint"]:
            raise ValueError(
                f"inputs {first.source.directory} (lora_a seed {first.lora_a.get('seed')}) and "
                f"{item.source.directory} (seed {item.lora_a.get('seed')}) do not share their LoRA A factors "
                f"(fingerprints differ): a factor-space merge would not be exact; use the dense merge (hf-dpmerge "
                "merge without --as-adapter) or retrain them with one --lora_a_seed"
            )
        scalings = {name: f.scaling for name, f in item.adapter.factors.items()}
        if scalings != {name: f.scaling for name, f in first.adapter.factors.items()}:
            raise ValueError(
                f"inputs {first.source.directory} and {item.source.directory} differ in their LoRA scaling "
                "(lora_alpha or rsLoRA); a merged adapter has one: use the dense merge"
            )


def _noise_variances(item: _Loaded, method: str, allow_non_private: bool) -> dict[str, torch.Tensor | float]:
    """V_B per layer of one input (``dp_aware``, ``cauchy_poe``'s DP-calibrated widths, a spectral noise floor), from
    its record and noise statistics (0 for a non-DP input)."""
    if item.merged:
        raise ValueError(
            f"input {item.source.directory} is itself a merged adapter: the noise variance of its B is not "
            f"recorded, so {method} cannot use it; merge the original adapters in one merge"
        )
    if item.source.overrides.get(NOISE_STD) is not None:
        raise ValueError(
            f"input {item.source.directory}: `noise_std` gives the dense task vector's noise, not B's; delete it "
            "(the record and dp_noise_stats.safetensors give B's)"
        )
    reference = adapter_input(item.source.directory)
    require_private(method, reference, allow_non_private)
    variances = {}
    for name in item.adapter.factors:
        noise = input_lora_b_noise(reference, name, item.source.overrides)
        variances[name] = 0.0 if noise is None else noise[1]
    return variances


def _input_name(directory: Path, record: PrivacyRecord) -> str:
    """How a release names an input: its task, else its run folder's name (never a path of this machine)."""
    return record.task or (directory.parent.name if directory.name in (ADAPTER_DIR, ENCODER_ADAPTER_DIR)
                           else directory.name)


def merge_shared_a_adapters(
    adapter_dirs: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    method: str = "task_arithmetic",
    lam: float = 1.0,
    weights: Sequence[float] | None = None,
    *,
    overrides: Sequence[Mapping[str, Any]] | None = None,
    base_model: str | None = None,
    allow_non_private: bool = False,
    overwrite: bool = False,
    shrinkage: str = "scale",
    options: Mapping[str, Any] | None = None,
    unwanted: Sequence[bool] | None = None,
    projection: str = "none",
) -> Path:
    """Write the merged adapter of ``adapter_dirs`` (shared-A LoRA adapters) to ``out_dir``; see the module doc.
    ``shrinkage`` is ``dp_aware``'s (``scale`` or ``soft_threshold``, as in its mergekit parameters).

    ``weights`` are the w_i (1 each by default); ``overrides`` the per-input record overrides of ``dp_aware``;
    ``base_model`` becomes the adapter's ``base_model_name_or_path`` (the first input's otherwise).
    ``options`` are the method's own mergekit parameters: ``cauchy_poe``'s (``tol``, ``jitter``, ``max_iter``,
    ``conv_tol``, ``layers``, ``dp_calibrated``) or a spectral method's (``noise_floor`` and ``k``,
    ``common_space_fraction`` or ``steps``/``lr``/``solver``); these methods weigh their inputs themselves, so every
    weight must be 1. ``noise_floor: record`` truncates each input at its noise edge s·e(V_B, A) (frozen A).
    ``safe_merge`` (``lam`` its ``scale``) adds the inputs not flagged in ``unwanted``, projected away from (or
    onto) the unwanted ones' outputs with ``projection``; with ``none`` it is its ``percentile: 100`` form.
    """
    if method not in FACTOR_METHODS:
        raise ValueError(f"--as-adapter merges with {list(FACTOR_METHODS)}, not {method!r}; use the dense merge")
    if not adapter_dirs:
        raise ValueError("no adapters to merge")
    weights = [1.0] * len(adapter_dirs) if weights is None else list(weights)
    overrides = [{}] * len(adapter_dirs) if overrides is None else list(overrides)
    if not len(weights) == len(overrides) == len(adapter_dirs):
        raise ValueError(f"{len(adapter_dirs)} adapters but {len(weights)} weights and {len(overrides)} overrides")
    options = dict(options or {})
    dp_calibrated = bool(options.pop("dp_calibrated", False))
    noise_floor = options.pop("noise_floor", "none")
    if method in ("cauchy_poe", *SPECTRAL_METHODS) and any(w != 1.0 for w in weights):
        raise ValueError(f"{method} weighs its inputs itself: drop the per-model `weight`")
    unwanted = [False] * len(adapter_dirs) if unwanted is None else [bool(u) for u in unwanted]
    if method == "safe_merge" and (all(unwanted) or not any(unwanted) or len(unwanted) != len(adapter_dirs)):
        raise ValueError("safe_merge needs at least one useful input and one marked `unwanted: true`")
    check_merge_output(out_dir, overwrite)
    inputs = [_load(AdapterInput(Path(d), float(w), dict(o))) for d, w, o in zip(adapter_dirs, weights, overrides)]
    check_shared_a(inputs)
    noised = method == "dp_aware" or (method == "cauchy_poe" and dp_calibrated) or noise_floor == "record"
    private = allow_non_private or method in SPECTRAL_METHODS  # a noise floor needs no guarantee, only the noise
    variances = [_noise_variances(item, method, private) for item in inputs] if noised else None

    first = inputs[0].adapter
    tensors: dict[str, torch.Tensor] = {}
    for name, factor in first.factors.items():
        layer_variances = None if variances is None else [v[name] for v in variances]
        lora_bs = [item.adapter.factors[name].lora_b for item in inputs]
        if method == "cauchy_poe":
            widths = None if layer_variances is None else [
                factor.scaling**2 * float((torch.as_tensor(v, dtype=torch.float64).expand(b.shape)
                                           @ factor.lora_a.double().square()).mean())
                for v, b in zip(layer_variances, lora_bs)]  # mean Var(τ_i) = mean s²·V_B·(A∘A)
            merged = cauchy_poe_lora_b(lora_bs, factor.lora_a, factor.scaling, lam, without_peft_prefix(name),
                                       widths, **options)
        elif method in SPECTRAL_METHODS:
            edges = None if layer_variances is None else [
                lora_noise_edge(factor.lora_a, b, factor.scaling, 0.0, v) for b, v in zip(lora_bs, layer_variances)]
            merged = spectral_lora_b(method, lora_bs, factor, lam, without_peft_prefix(name), edges, options)
        elif method == "safe_merge" and projection != "none":
            merged = safe_merge_lora_b(lora_bs, weights, unwanted, factor.lora_a, factor.scaling, lam, projection,
                                       without_peft_prefix(name), factor.fan_in_fan_out)
        elif method == "safe_merge":  # percentile 100: task arithmetic of the useful inputs
            merged = merged_lora_b(lora_bs, [0.0 if u else w for w, u in zip(weights, unwanted)], lam)
        else:
            merged = merged_lora_b(lora_bs, weights, lam, layer_variances, factor.lora_a, shrinkage)
        tensors[factor.saved_a] = factor.lora_a.contiguous()
        tensors[factor.saved_b] = merged.to(factor.lora_b.dtype).contiguous()
    config = json.loads((inputs[0].source.directory / ADAPTER_CONFIG_NAME).read_text())
    if base_model is not None:
        config["base_model_name_or_path"] = base_model
    records: dict[str, PrivacyRecord] = {}
    for item in inputs:
        for name, record in item.records.items():
            if name in records:
                raise ValueError(f"two inputs are both named {name!r} (their tasks): merge each task once")
            records[name] = record
    names = [", ".join(item.records) for item in inputs]
    lora_a = {"seed": inputs[0].lora_a.get("seed") if len({i.lora_a.get("seed") for i in inputs}) == 1 else None,
              "fingerprint": inputs[0].lora_a["fingerprint"]}
    parameters = {"lambda": lam, **({"shrinkage": shrinkage} if method == "dp_aware" else {}),
                  **({**options, "dp_calibrated": dp_calibrated} if method == "cauchy_poe" else {}),
                  **({**options, "noise_floor": noise_floor} if method in SPECTRAL_METHODS else {}),
                  **({"projection": projection} if method == "safe_merge" else {})}
    description = {"merge_method": method, "parameters": parameters,
                   "models": [{"model": name, "parameters": {"weight": item.source.weight,
                                                            **({"unwanted": True} if flag else {})}}
                              for name, item, flag in zip(names, inputs, unwanted)]}
    with staged_directory(out_dir) as staged:
        staged.mkdir()
        save_file(tensors, staged / ADAPTER_SAFETENSORS_NAME, metadata={"format": "pt"})
        (staged / ADAPTER_CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        (staged / MERGE_RECORD_NAME).write_text(json.dumps(
            {**description, "lora_a": lora_a, "records": {n: r.to_dict() for n, r in records.items()}}, indent=2
        ) + "\n")
        (staged / MERGE_MARKER).write_text("# hf-dpmerge merge --as-adapter\n" + yaml.safe_dump(description))
        card = merged_adapter_card(method, lam, [(name, "unwanted: never added" if flag else item.source.weight)
                                                 for name, item, flag in zip(names, inputs, unwanted)],
                                   lora_a["fingerprint"], records, config.get("base_model_name_or_path"))
        (staged / CARD_NAME).write_text(str(card), encoding="utf-8")
    return Path(out_dir)
