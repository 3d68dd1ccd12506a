"""The transformers model a run trains: under a peft wrapper, the wrapped model (adapter layers in place)."""

from __future__ import annotations

from torch import nn


def unwrapped_model(model: nn.Module) -> nn.Module:
    """``model.get_base_model()`` for a ``PeftModel`` (its ``LoraLayer``s stay in the returned modules); ``model``
    itself otherwise."""
    get_base_model = getattr(model, "get_base_model", None)
    return get_base_model() if callable(get_base_model) else model
