"""Generated mergekit configurations for LoRA adapters on one base, in the shape of ``merge_configs/*.yaml``.

Each input is ``<base>+<adapter>`` (mergekit applies the LoRA with peft before merging); shared
``parameters:`` are the method's defaults from :data:`METHOD_PARAMETERS` (the values in
``merge_configs/<method>.yaml``), and per-model ``weight:`` values are written when given. Under task
arithmetic a LoRA weight matrix becomes W = W₀ + λ·Σᵢ wᵢ·τᵢ with τᵢ = sᵢ·Bᵢ·Aᵢ. Every config is parsed
with mergekit's ``MergeConfiguration`` before it is returned, so a written file is one mergekit accepts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from mergekit.config import MergeConfiguration

METHOD_PARAMETERS: dict[str, dict[str, Any]] = {
    "task_arithmetic": {"weight": 1.0, "lambda": 0.5},
    "ties": {"weight": 1.0, "lambda": 1.0, "density": 0.2},
    "dp_aware": {"lambda": 0.5, "consensus": "none", "noise": "record"},
    "cauchy_poe": {"lambda": 1.0, "tol": 0.01, "dp_calibrated": True, "layers": "reference"},
}
"""Shared parameters per merge method: those of ``merge_configs/<method>.yaml`` (dp_aware: ``dp.yaml``)."""


def mergekit_path(path: str | os.PathLike) -> str:
    """``path`` as a mergekit model reference: relative paths start with ``./`` (mergekit's model card
    reads a relative path with exactly one ``/`` as a Hub repo id and fails offline)."""
    text = Path(path).as_posix()
    if Path(path).is_absolute() or text.startswith(("./", "../")):
        return text
    return f"./{text}"


def mergekit_config(
    method: str,
    base: str | os.PathLike,
    models: Sequence[str | os.PathLike],
    *,
    parameters: Mapping[str, Any] | None = None,
    per_model: Sequence[Mapping[str, Any] | None] | None = None,
) -> dict[str, Any]:
    """The one builder of mergekit configurations: ``models`` (model references: a path, or ``base+adapter``,
    :func:`lora_reference`) merged on ``base`` with ``method``, shared ``parameters`` and, per model, the
    ``per_model`` parameters; parsed with mergekit's ``MergeConfiguration`` (``ValueError`` when it rejects it)."""
    if per_model is not None and len(per_model) != len(models):
        raise ValueError(f"{len(per_model)} per-model settings for {len(models)} models: give one per model")
    entries = []
    for index, model in enumerate(models):
        settings = dict(per_model[index] or {}) if per_model is not None else {}
        entries.append({"model": str(model), **({"parameters": settings} if settings else {})})
    config = {"merge_method": method, "base_model": mergekit_path(base), "models": entries, "dtype": "float32",
              "parameters": dict(parameters or {})}
    try:
        MergeConfiguration.model_validate(config)
    except Exception as err:  # pydantic's ValidationError; report it as bad input
        raise ValueError(f"mergekit rejects the generated {method} config: {err}") from None
    return config


def lora_reference(base: str | os.PathLike, adapter: str | os.PathLike) -> str:
    """mergekit's ``base+adapter`` reference (peft applies the LoRA before merging)."""
    return f"{mergekit_path(base)}+{mergekit_path(adapter)}"


def lora_merge_config(
    method: str,
    base: str | os.PathLike,
    adapters: Sequence[str | os.PathLike],
    *,
    weights: Sequence[float] | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The mergekit config merging ``adapters`` (LoRA directories) on ``base`` with ``method``.

    ``weights`` (one per adapter) become per-model ``weight:`` values; ``parameters`` update the method's
    shared defaults. Raises ``ValueError`` for an unknown method, a weight count that does not match, or
    a config mergekit rejects.
    """
    if method not in METHOD_PARAMETERS:
        raise ValueError(f"unknown merge method {method!r}; choose one of {sorted(METHOD_PARAMETERS)} (--method)")
    if weights is not None and len(weights) != len(adapters):
        raise ValueError(f"{len(weights)} weights for {len(adapters)} adapters: give one weight per adapter")
    return mergekit_config(
        method, base, [lora_reference(base, adapter) for adapter in adapters],
        parameters={**METHOD_PARAMETERS[method], **(parameters or {})},
        per_model=None if weights is None else [{"weight": float(w)} for w in weights],
    )


def merge_config_yaml(config: Mapping[str, Any], comment: str = "") -> str:
    """``config`` as YAML, after ``comment`` lines (each prefixed with ``# ``)."""
    header = "".join(f"# {line}\n" if line else "#\n" for line in comment.splitlines())
    return header + yaml.safe_dump(dict(config), sort_keys=False, allow_unicode=True)
