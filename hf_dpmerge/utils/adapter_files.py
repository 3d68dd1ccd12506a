"""The file and key names of a saved peft adapter (peft's ``CONFIG_NAME``, ``SAFETENSORS_WEIGHTS_NAME`` and
``WEIGHTS_NAME``, and the prefix of its state-dict keys), spelled here so that reading an adapter does not
import peft, and how a release names the adapter's base (:func:`set_adapter_base`)."""

import json
import os
from pathlib import Path

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
ADAPTER_BASE_DIR = "base"
"""The folder inside a released task adapter that holds its base for stock loaders; ``adapter_config.json``'s
``base_model_name_or_path`` names it by this path, relative to the adapter folder."""


def set_adapter_base(directory: str | os.PathLike, reference: str | None) -> None:
    """Name the base in ``directory/adapter_config.json`` (``base_model_name_or_path``) by ``reference``: a Hub id,
    a path relative to the adapter folder (:data:`ADAPTER_BASE_DIR`) or None, never a path of the training
    machine."""
    path = Path(directory) / ADAPTER_CONFIG_NAME
    config = json.loads(path.read_text())
    config["base_model_name_or_path"] = reference
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
