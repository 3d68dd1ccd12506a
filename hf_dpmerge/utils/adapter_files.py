"""The file and key names of a saved peft adapter (peft's ``CONFIG_NAME``, ``SAFETENSORS_WEIGHTS_NAME`` and
``WEIGHTS_NAME``, and the prefix of its state-dict keys), spelled here so that reading an adapter does not
import peft."""

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
