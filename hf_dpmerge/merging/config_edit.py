"""Reading, editing and writing mergekit YAML configurations as plain mappings (score weights, tuning grids).

Parameters are set where mergekit reads them: ``parameters.<name>`` at the top level (shared by every
input unless an input overrides it) or ``models[i].parameters.<name>`` for input ``i`` (0-based, in the
order of ``models:``). mergekit's pydantic models drop keys they do not know, so a misspelt ``paramters:`` would
merge with every default; :func:`load_config_mapping` refuses any key outside mergekit's schema, naming it and
the closest known key (:func:`unknown_config_keys`).
"""

from __future__ import annotations

import copy
import difflib
import os
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml


def load_config_mapping(path: str | os.PathLike) -> dict[str, Any]:
    """The YAML mapping at ``path`` (mergekit reports an empty file as a pydantic type error)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no merge config at {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ValueError(f"merge config {path} is not valid YAML ({err})") from None
    if not isinstance(data, dict) or not data:
        raise ValueError(f"merge config {path} is empty or not a mapping: it needs merge_method and models or slices")
    if unknown := list(unknown_config_keys(data)):
        raise ValueError(f"merge config {path}: unknown key {'; '.join(unknown)} (mergekit would ignore it silently "
                         "and merge with its defaults): fix the spelling")
    return data


def _schema_models(annotation: Any) -> list[type]:
    """The pydantic model classes inside a field annotation (``Optional[List[X]]``, ``Dict[str, X]``, …)."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list, dict, tuple):
        return [model for argument in typing.get_args(annotation) for model in _schema_models(argument)]
    return []


def _unknown_keys(data: Any, schema: type, where: str) -> Iterator[str]:
    if not isinstance(data, dict):
        return
    fields = schema.model_fields
    known = {name for field_name, info in fields.items() for name in (field_name, info.alias) if name}
    for key, value in data.items():
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), 1)
            yield f"{where}{key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
            continue
        models = _schema_models(fields[key].annotation)
        if len(models) != 1:  # a scalar, or a union of several models (mergekit validates those itself)
            continue
        if isinstance(value, list):
            for index, item in enumerate(value):
                yield from _unknown_keys(item, models[0], f"{where}{key}[{index}].")
        elif isinstance(value, dict) and _is_mapping_of_models(fields[key].annotation):
            for name, item in value.items():
                yield from _unknown_keys(item, models[0], f"{where}{key}.{name}.")
        else:
            yield from _unknown_keys(value, models[0], f"{where}{key}.")


def _is_mapping_of_models(annotation: Any) -> bool:
    """Whether the annotation is (an Optional of) ``Dict[str, Model]``."""
    if typing.get_origin(annotation) is dict:
        return True
    return any(_is_mapping_of_models(argument) for argument in typing.get_args(annotation)
               if typing.get_origin(annotation) in (typing.Union, types.UnionType))


def unknown_config_keys(data: dict[str, Any]) -> Iterator[str]:
    """Every key of the mapping ``data`` outside mergekit's ``MergeConfiguration`` schema (nested model, slice and
    module definitions included), as ``'path.key' (did you mean 'x'?)``. Method parameters are free-form here:
    each method checks its own (:func:`hf_dpmerge.merging.validation.check_parameter_keys`)."""
    from mergekit.config import MergeConfiguration

    return _unknown_keys(data, MergeConfiguration, "")


def read_merge_config(path: str | os.PathLike) -> dict[str, Any]:
    """:func:`load_config_mapping`, refusing a config without a ``models:`` list (grids and weights index it)."""
    data = load_config_mapping(path)
    if not isinstance(data.get("models"), list) or not data["models"]:
        raise ValueError(f"merge config {path} needs a non-empty 'models:' list (slices are not supported here)")
    return data


def with_parameter(config: dict[str, Any], name: str, value: Any, model_index: int | None = None) -> dict[str, Any]:
    """A copy of ``config`` with ``parameters.<name>`` (or ``models[model_index].parameters.<name>``) = ``value``."""
    edited = copy.deepcopy(config)
    if model_index is None:
        target = edited
    else:
        models = edited["models"]
        if not 0 <= model_index < len(models):
            raise ValueError(f"model index {model_index} is out of range: the config has {len(models)} models "
                             "(0-based)")
        target = models[model_index]
    target["parameters"] = {**(target.get("parameters") or {}), name: value}
    return edited


def write_merge_config(path: str | os.PathLike, config: dict[str, Any], header: str) -> Path:
    """Write ``config`` as YAML with ``header`` as leading ``#`` comment lines; returns the path."""
    path = Path(path)
    comments = "".join(f"# {line}\n" for line in header.splitlines())
    path.write_text(comments + yaml.safe_dump(config, sort_keys=False))
    return path
