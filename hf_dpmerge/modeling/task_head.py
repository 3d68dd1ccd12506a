"""A task's own classifier head: the tensors an adapter saves in peft ``modules_to_save``.

peft saves them as ``base_model.model.<module>.modules_to_save.default.<param>`` (or without the wrapper
part); :func:`task_head_state` renames them as in the plain model, so they load into a task model — the
base with the adapter, or the merged encoder — with :func:`attach_head`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf_dpmerge.utils.adapter_files import (
    ADAPTER_CONFIG_NAME,
    AdapterWeightsError,
    read_adapter_weights,
    without_peft_prefix,
)

if TYPE_CHECKING:  # torch is imported where a .bin adapter is read: the Hub release path stays light
    import torch



class TaskHeadError(AdapterWeightsError):
    """An adapter whose task head cannot be read, or a head that does not fit a model."""


def in_modules(name: str, modules: list[str]) -> bool:
    """Whether parameter ``name`` lies in one of ``modules`` (matched as peft does, on whole path parts)."""
    parts = name.split(".")
    owners = [".".join(parts[:i]) for i in range(1, len(parts))]
    return any(owner == m or owner.endswith("." + m) for owner in owners for m in modules)


def task_head_state(adapter_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The adapter's ``modules_to_save`` tensors (its task head), named as in the plain model."""
    adapter_dir = Path(adapter_dir)
    config_path = adapter_dir / ADAPTER_CONFIG_NAME
    if not config_path.is_file():
        raise TaskHeadError(f"{adapter_dir} is not a peft adapter: it has no adapter_config.json")
    try:
        adapter_config = json.loads(config_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise TaskHeadError(f"{config_path}: corrupt adapter config ({err})") from None
    modules = [m for m in (adapter_config.get("modules_to_save") or []) if isinstance(m, str)]
    if not modules:
        raise TaskHeadError(
            f"adapter {adapter_dir} saves no classifier head (modules_to_save is empty): train it with "
            "task_type SEQ_CLS and the classifier in modules_to_save, so that each task keeps its own head"
        )
    head: dict[str, torch.Tensor] = {}
    for key, tensor in read_adapter_weights(adapter_dir).items():
        if "lora_" in key:
            continue
        name = without_peft_prefix(key)
        name = name.replace(".modules_to_save.default.", ".")
        if in_modules(name, modules):
            head[name] = tensor.detach().cpu().contiguous()
    if not head:
        raise TaskHeadError(f"adapter {adapter_dir} has no tensors for its modules_to_save {modules}")
    return head


def attach_head(model: torch.nn.Module, head: dict[str, Any], source: str = "adapter") -> None:
    """Copy ``head`` into ``model`` in place, checking names and shapes and that whole modules are replaced."""
    state = model.state_dict()
    unknown = sorted(set(head) - set(state))
    if unknown:
        raise TaskHeadError(f"{source}: head tensors {unknown} do not exist in the model")
    wrong = [f"{n} {tuple(head[n].shape)} vs {tuple(state[n].shape)}" for n in head if head[n].shape != state[n].shape]
    if wrong:
        raise TaskHeadError(f"{source}: head shapes differ from the model's: {wrong}")
    modules = {name.rsplit(".", 1)[0] for name in head}
    partial = sorted(n for n in state if n.rsplit(".", 1)[0] in modules and n not in head)
    if partial:
        raise TaskHeadError(f"{source}: head replaces only part of its modules (missing {partial})")
    model.load_state_dict(head, strict=False)
