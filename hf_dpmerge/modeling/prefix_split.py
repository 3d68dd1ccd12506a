"""A model split at a layer boundary b: a bottom (embeddings + layers[:b]) and a top (layers[b:], the final norm or
pooling, the head).

When the bottom holds no trainable parameter its output is a fixed public function of each example, so training
can compute it once (:func:`boundary_inputs`) and run every step through the top alone (:func:`bottom_skipped`:
the model's own forward with the bottom layers replaced by pass-throughs, fed the cached states as
``inputs_embeds``; docs/design.md §16). Supported: BERT-family encoders (``encoder.layer``; their embeddings add
absolute positions, so they are bypassed too) and Llama-family decoders (``layers``; the top makes the causal
mask from the attention mask and the rotary positions from the left edge of the padded batch, as the full forward
makes them: right-padded rows hold the same positions either way).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hf_dpmerge.modeling.unwrapped import unwrapped_model


@dataclass(frozen=True)
class LayerStack:
    """The transformer blocks of a model: ``backbone`` (the module taking ``inputs_embeds``), its ``layers``, and
    the name of its embeddings module when ``inputs_embeds`` still goes through it (BERT), else None (Llama)."""

    backbone: nn.Module
    layers: nn.ModuleList
    embeddings_name: str | None


def layer_stack(model: nn.Module) -> LayerStack:
    """The :class:`LayerStack` of a (peft-wrapped) BERT-family or Llama-family transformers model."""
    base = unwrapped_model(model)
    backbone = getattr(base, "base_model", base)
    encoder = getattr(backbone, "encoder", None)
    if isinstance(getattr(encoder, "layer", None), nn.ModuleList) and hasattr(backbone, "embeddings"):
        return LayerStack(backbone, encoder.layer, "embeddings")
    if isinstance(getattr(backbone, "layers", None), nn.ModuleList) and hasattr(backbone, "embed_tokens"):
        return LayerStack(backbone, backbone.layers, None)
    raise ValueError(f"{type(base).__name__}: a cached prefix needs a BERT-family encoder (encoder.layer) or a "
                     "Llama-family decoder (layers); train it without one (--cache_prefix false)")


def trainable_boundary(model: nn.Module, head: nn.Module | None) -> int | None:
    """b = the lowest layer holding a trainable parameter (the number of layers when only ``head`` trains); None
    when a trainable parameter lies outside the layers and ``head`` (the embeddings, say): no prefix is frozen."""
    stack = layer_stack(model)
    in_layer = {id(p): i for i, layer in enumerate(stack.layers) for p in layer.parameters()}
    in_head = {id(p) for p in head.parameters()} if head is not None else set()
    boundary = len(stack.layers)
    for parameter in model.parameters():
        if not parameter.requires_grad or id(parameter) in in_head:
            continue
        if id(parameter) not in in_layer:
            return None
        boundary = min(boundary, in_layer[id(parameter)])
    return boundary


class _PassThroughLayer(nn.Module):
    """A skipped block: returns its hidden states unchanged (the block's own return type: one tensor)."""

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return hidden_states


class _PassThroughEmbeddings(nn.Module):
    """BERT embeddings replaced by their ``inputs_embeds`` (the cached states already hold the positions)."""

    def forward(self, *args: Any, inputs_embeds: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
        return inputs_embeds


@contextmanager
def bottom_skipped(model: nn.Module, boundary: int) -> Iterator[LayerStack]:
    """Inside the block the model's forward, given the boundary states as ``inputs_embeds``, runs layers[boundary:]
    only (the bottom blocks and BERT's embeddings pass their input through); the modules are restored after it.
    Parameter names of the top are unchanged (layer i keeps index i)."""
    stack = layer_stack(model)
    bottom = [stack.layers[i] for i in range(boundary)]
    embeddings = getattr(stack.backbone, stack.embeddings_name) if stack.embeddings_name else None
    try:
        for i in range(boundary):
            stack.layers[i] = _PassThroughLayer()
        if embeddings is not None:
            setattr(stack.backbone, stack.embeddings_name, _PassThroughEmbeddings())
        yield stack
    finally:
        for i, layer in enumerate(bottom):
            stack.layers[i] = layer
        if embeddings is not None:
            setattr(stack.backbone, stack.embeddings_name, embeddings)


class _Captured(Exception):
    """Raised by the capture hook: the rest of the forward pass is not needed."""


@torch.no_grad()
def boundary_inputs(model: nn.Module, module: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The first input of ``module`` (a layer's hidden states, or the head's pooled features) when ``model`` runs
    on ``batch``; the forward pass stops there. The caller sets evaluation mode (no dropout in the bottom)."""
    captured: list[torch.Tensor] = []

    def capture(_: nn.Module, args: tuple, kwargs: dict) -> None:
        captured.append((args[0] if args else kwargs["hidden_states"]).detach())
        raise _Captured

    hook = module.register_forward_pre_hook(capture, with_kwargs=True)
    try:
        model(**batch)
    except _Captured:
        pass
    finally:
        hook.remove()
    if not captured:
        raise RuntimeError(f"{type(module).__name__} did not run in the forward pass: no boundary states to cache")
    return captured[0]
