"""The file and key names of a saved peft adapter (peft's ``CONFIG_NAME``, ``SAFETENSORS_WEIGHTS_NAME`` and
``WEIGHTS_NAME``, and the prefix of its state-dict keys), spelled here so that naming an adapter's files does not
import peft, :func:`read_adapter_weights`, the one reader of a saved adapter's tensors (peft's
``load_peft_weights`` on a local folder, with errors that name the file), and how a release names the adapter's
base (:func:`set_adapter_base`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ADAPTER_CONFIG_NAME = "adapter_config.json"
ADAPTER_SAFETENSORS_NAME = "adapter_model.safetensors"
ADAPTER_BIN_NAME = "adapter_model.bin"
ADAPTER_WEIGHTS_NAMES = (ADAPTER_SAFETENSORS_NAME, ADAPTER_BIN_NAME)
"""Weights files in the order peft prefers them."""
PEFT_PREFIX = "base_model.model."
"""What peft's ``PeftModel`` puts before a plain model's parameter names."""


def without_peft_prefix(name: str) -> str:
    """``name`` as in the plain model (the ``base_model.model.`` prefix dropped, if present)."""
    return name.removeprefix(PEFT_PREFIX)


class AdapterWeightsError(ValueError):
    """A local adapter folder without weights, or with a weights file that cannot be read (truncated, corrupt)."""


def adapter_weight_files(adapter_dir: str | os.PathLike) -> list[Path]:
    """The weights files of the adapter saved in the local folder ``adapter_dir``, in peft's order of preference;
    :class:`AdapterWeightsError` when there is none."""
    directory = Path(adapter_dir)
    files = [directory / name for name in ADAPTER_WEIGHTS_NAMES if (directory / name).is_file()]
    if not files:
        raise AdapterWeightsError(f"{directory} has no adapter weights ({' or '.join(ADAPTER_WEIGHTS_NAMES)})")
    return files


def read_adapter_weights(adapter_dir: str | os.PathLike) -> dict[str, Any]:
    """Every tensor of the adapter saved in the local folder ``adapter_dir`` (on the CPU), read by peft's
    ``load_peft_weights`` (safetensors preferred); :class:`AdapterWeightsError` names the folder or file when there
    is no weights file (peft would look for it on the Hub) or it is unreadable."""
    from peft.utils import load_peft_weights

    directory = Path(adapter_dir)
    files = adapter_weight_files(directory)
    try:
        return load_peft_weights(str(directory), device="cpu")
    except Exception as err:  # noqa: BLE001 - safetensors and torch raise many types for corrupt files
        raise AdapterWeightsError(f"{files[0]}: unreadable adapter weights ({err}); re-save or re-download the "
                                  "adapter") from None


ADAPTER_BASE_DIR = "."
"""Where a released task adapter holds its base for stock loaders: the adapter folder itself (its ``config.json``
beside ``adapter_config.json``, which transformers loads as "a model with an embedded adapter" from any working
directory); ``adapter_config.json``'s ``base_model_name_or_path`` names it by this path, relative to the adapter
folder."""


def set_adapter_base(directory: str | os.PathLike, reference: str | None) -> None:
    """Name the base in ``directory/adapter_config.json`` (``base_model_name_or_path``) by ``reference``: a Hub id,
    a path relative to the adapter folder (:data:`ADAPTER_BASE_DIR`) or None, never a path of the training
    machine. ``modules_to_save`` is listed once each (peft appends its ``classifier``/``score`` to the list it was
    given, so a sequence classifier saves ``classifier`` twice)."""
    path = Path(directory) / ADAPTER_CONFIG_NAME
    config = json.loads(path.read_text())
    config["base_model_name_or_path"] = reference
    if isinstance(config.get("modules_to_save"), list):
        config["modules_to_save"] = list(dict.fromkeys(config["modules_to_save"]))
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
