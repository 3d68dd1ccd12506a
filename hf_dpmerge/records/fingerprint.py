"""Fingerprints: of the base weights an adapter was trained on, checkable from a saved base directory, and of a saved
adapter itself (:func:`adapter_fingerprint`).

The base fingerprint covers the base tensors the adapter's LoRA layers modify (each ``base_layer`` weight), named
as in a plain ``save_pretrained`` of the base model, so a merge can recompute it from the base checkpoint and
refuse adapters trained on another base. Task heads (``modules_to_save``) are left out: each task may start
from its own freshly initialised head, and heads are never merged.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from torch import nn

from hf_dpmerge.records.record import PRIVACY_RECORD_NAME
from hf_dpmerge.utils.adapter_files import adapter_weight_files, without_peft_prefix


def base_fingerprint(named_tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 over (name, shape, float32 bytes) of the tensors, in sorted name order."""
    digest = hashlib.sha256()
    for name in sorted(named_tensors):
        tensor = named_tensors[name].detach().to("cpu", torch.float32).contiguous()
        digest.update(name.encode())
        digest.update(json.dumps(list(tensor.shape)).encode())
        digest.update(tensor.numpy().tobytes())
    return "sha256:" + digest.hexdigest()


def adapter_fingerprint(adapter_dir: str | os.PathLike) -> str:
    """sha256 over a saved adapter's weights file(s) and its ``dp_privacy.json``, each as (name, size, bytes): what a
    private merge selection was made with (:class:`~hf_dpmerge.records.selection_record.SelectionRecord`), so that a
    release of other adapters under it is refused."""
    digest = hashlib.sha256()
    for path in [*adapter_weight_files(adapter_dir), Path(adapter_dir) / PRIVACY_RECORD_NAME]:
        digest.update(f"{path.name}:{path.stat().st_size}:".encode())
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def _canonical(module_name: str) -> str:
    return without_peft_prefix(module_name)


def peft_base_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Base weights under a peft model's LoRA layers, named as in the base checkpoint."""
    from peft.tuners.lora import LoraLayer

    return {
        _canonical(name) + ".weight": module.get_base_layer().weight
        for name, module in model.named_modules()
        if isinstance(module, LoraLayer)
    }


def _safetensors_index(base_dir: Path) -> dict[str, Path]:
    index_file = base_dir / "model.safetensors.index.json"
    if index_file.exists():
        weight_map = json.loads(index_file.read_text())["weight_map"]
        return {name: base_dir / shard for name, shard in weight_map.items()}
    single = base_dir / "model.safetensors"
    if not single.exists():
        raise FileNotFoundError(f"{base_dir}: no model.safetensors or model.safetensors.index.json")
    from safetensors import safe_open

    with safe_open(single, "pt") as handle:
        return {name: single for name in handle.keys()}


def saved_tensor_names(model_dir: str | Path) -> list[str]:
    """The names of the tensors a saved model directory holds (safetensors, single or sharded), sorted."""
    return sorted(_safetensors_index(Path(model_dir)))


def directory_base_tensors(base_dir: str | Path, names: Iterable[str]) -> dict[str, torch.Tensor]:
    """Load the named tensors from a saved base model directory (safetensors, single or sharded)."""
    from safetensors import safe_open

    base_dir = Path(base_dir)
    index = _safetensors_index(base_dir)
    names = list(names)
    missing = [n for n in names if n not in index]
    if missing:
        raise KeyError(f"{base_dir}: base model lacks tensors {missing[:5]}{' …' if len(missing) > 5 else ''}")
    tensors: dict[str, torch.Tensor] = {}
    for name in names:
        with safe_open(index[name], "pt") as handle:
            tensors[name] = handle.get_tensor(name)
    return tensors


def directory_fingerprint(base_dir: str | Path, names: Iterable[str]) -> str:
    """:func:`base_fingerprint` of the named tensors of a saved base directory, or ``(missing tensors: …)`` when it
    lacks some (never equal to a recorded fingerprint)."""
    try:
        return base_fingerprint(directory_base_tensors(base_dir, names))
    except KeyError as err:
        return f"(missing tensors: {err})"
