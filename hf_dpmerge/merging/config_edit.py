"""Reading, editing and writing mergekit YAML configurations as plain mappings (score weights, tuning grids).

Parameters are set where mergekit reads them: ``parameters.<name>`` at the top level (shared by every
input unless an input overrides it) or ``models[i].parameters.<name>`` for input ``i`` (0-based, in the
order of ``models:``).
"""

from __future__ import annotations

import copy
import os
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
    return data


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
