"""Mean-pooling BERT sequence classifier, as remote code for stock transformers (``trust_remote_code=True``).

Copied verbatim next to ``config.json`` in every release (``auto_map`` points at it), so it imports torch and
transformers only, never hf_dpmerge. The classifier reads the masked token mean

    h̄ = Σ_t m_t·h_t / max(Σ_t m_t, 1)        (m = attention mask, h_t = last hidden states)

instead of the [CLS] → pooler path; the unknown ``model_type`` ``mean_pooling_bert`` makes stock loaders refuse
a release without ``trust_remote_code=True`` rather than compute another function. A config's
``shared_encoder_weights`` (a weights file relative to its folder, e.g. ``../model.safetensors``) makes
``from_pretrained`` load that encoder and the folder's ``head.safetensors`` as one state dict, locally or from the
Hub (then the peft adapter an Auto class was pointed at); ``task_modulator`` (an EMR merge) then modulates it
with the root's unified delta: W_t = W_root + (λ_t·M_t − 1) ⊙ δ_uni (:func:`modulated`). See docs/design.md §10.
"""

from __future__ import annotations

import os
import posixpath
from typing import Any

import torch
from safetensors.torch import load_file
from torch.nn import BCEWithLogitsLoss, CrossEntropyLoss, MSELoss
from transformers import BertConfig, BertForSequenceClassification, PretrainedConfig
from transformers.modeling_outputs import SequenceClassifierOutput
from transformers.utils import cached_file

SHARED_ENCODER_KEY = "shared_encoder_weights"  # config.json: the encoder's weights file, relative to the task folder
HEAD_WEIGHTS_FILE = "head.safetensors"  # a task folder's classifier head, beside its config.json
HEAD_PREFIX = "classifier."
TASK_MODULATOR_KEY = "task_modulator"  # config.json: the task's EMR masks and rescaler, relative to the task folder
UNIFIED_DELTA_KEY = "unified_delta"  # config.json: the EMR root's unified delta δ_uni, relative to the task folder
MODULATOR_SCALE = "__rescaler__"  # the rescaler λ_t's entry in a task modulator file (weights never bear the name)
_HUB_KWARGS = ("cache_dir", "force_download", "proxies", "local_files_only", "token", "revision")


class MeanPoolingBertConfig(BertConfig):
    """``BertConfig`` under its own ``model_type``, so stock Auto classes need the remote code to load it."""

    model_type = "mean_pooling_bert"


def masked_mean(hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """h̄ = Σ_t m_t·h_t / max(Σ_t m_t, 1) over the sequence axis (all tokens when no mask is given). m is the
    [b, T] 0/1 padding mask, or, as BertModel takes either, read off a prepared additive [b, 1, 1|T, T] mask: the
    keys its last query row attends (entries 0)."""
    if attention_mask is None:
        return hidden_states.mean(dim=1)
    if attention_mask.dim() == 4:
        attention_mask = attention_mask[:, 0, -1, :] == 0
    mask = attention_mask.unsqueeze(-1).to(hidden_states.dtype)
    return (hidden_states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


def release_file(location: str | os.PathLike, subfolder: str, relative: str, hub: dict[str, Any]) -> str:
    """The file ``relative`` (a path from the task folder ``location``/``subfolder``): a local path when
    ``location`` is a folder, else downloaded from the Hub repository ``location`` (``hub``: its options)."""
    if os.path.isdir(location):
        path = os.path.normpath(os.path.join(location, subfolder, relative))
        if not os.path.isfile(path):
            raise OSError(
                f"{path} does not exist: the task folder's config.json takes its encoder from {relative!r} "
                f"({SHARED_ENCODER_KEY}); load it inside the release or runs folder it belongs to (download the whole "
                "release, not only the task folder)"
            )
        return path
    in_repo = posixpath.normpath(posixpath.join(subfolder, relative))
    if in_repo == ".." or in_repo.startswith("../") or posixpath.isabs(in_repo):
        raise OSError(f"{SHARED_ENCODER_KEY}={relative!r} points outside the repository {location}")
    folder, name = posixpath.split(in_repo)
    return cached_file(str(location), name, subfolder=folder, **hub)


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """A boolean mask as uint8 bytes, eight entries per byte (most significant bit first, zero-padded)."""
    bits = torch.nn.functional.pad(mask.flatten().to(torch.uint8), (0, -mask.numel() % 8)).view(-1, 8)
    return (bits << torch.arange(7, -1, -1, dtype=torch.uint8)).sum(dim=1, dtype=torch.uint8)


def unpack_mask(packed: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The boolean mask of ``shape`` that :func:`pack_mask` packed."""
    bits = (packed.unsqueeze(1) >> torch.arange(7, -1, -1, dtype=torch.uint8)) & 1
    return bits.flatten()[: shape.numel()].view(shape).bool()


def modulated(state: dict[str, torch.Tensor], unified: dict[str, torch.Tensor],
              modulator: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """EMR's task model from the root's weights ``state`` (W_root = W_0 + δ_uni): every weight of ``unified`` (δ_uni)
    becomes W_root + (λ_t·M_t − 1) ⊙ δ_uni = W_0 + λ_t·M_t ⊙ δ_uni, with ``modulator`` the task's packed masks M_t
    (:func:`pack_mask`) and its rescaler λ_t (``MODULATOR_SCALE``); a weight without a mask reverts to W_0."""
    scale = float(modulator[MODULATOR_SCALE])
    result = dict(state)
    for name, delta in unified.items():
        mask = unpack_mask(modulator[name], delta.shape) if name in modulator else torch.zeros_like(delta, dtype=bool)
        result[name] = (state[name] + (scale * mask - 1) * delta).to(state[name].dtype)
    return result


class MeanPoolingBertForSequenceClassification(BertForSequenceClassification):
    """``BertForSequenceClassification`` whose classifier reads the masked token mean instead of [CLS]."""

    config_class = MeanPoolingBertConfig

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, *model_args: Any, **kwargs: Any):
        """Stock ``from_pretrained``; a task folder whose config names ``shared_encoder_weights`` loads that
        encoder (its ``classifier.*`` dropped) with the folder's ``head.safetensors``. The loaded model's config
        no longer names the shared file, so ``save_pretrained`` writes a complete model."""
        location, config = pretrained_model_name_or_path, kwargs.get("config")
        subfolder = kwargs.get("subfolder") or ""
        hub = {key: kwargs[key] for key in _HUB_KWARGS if key in kwargs}
        if location is None or not (config is None or isinstance(config, PretrainedConfig)):
            return super().from_pretrained(location, *model_args, **kwargs)
        if config is None:
            config = cls.config_class.from_pretrained(location, subfolder=subfolder, **hub)
        relative = getattr(config, SHARED_ENCODER_KEY, None)
        if not relative:
            return super().from_pretrained(location, *model_args, **kwargs)
        encoder = load_file(release_file(location, subfolder, relative, hub))
        state = {key: value for key, value in encoder.items() if not key.startswith(HEAD_PREFIX)}
        state.update(load_file(release_file(location, subfolder, HEAD_WEIGHTS_FILE, hub)))
        if getattr(config, TASK_MODULATOR_KEY, None):
            state = modulated(state, load_file(release_file(location, subfolder, config.unified_delta, hub)),
                              load_file(release_file(location, subfolder, config.task_modulator, hub)))
            config.task_modulator = config.unified_delta = None
        rest = {key: value for key, value in kwargs.items() if key not in (*_HUB_KWARGS, "subfolder", "config")}
        adapter_kwargs = dict(rest.pop("adapter_kwargs", None) or {})
        adapter = adapter_kwargs.pop("_adapter_model_path", None)  # Auto classes pointed at a peft adapter
        setattr(config, SHARED_ENCODER_KEY, None)
        model = super().from_pretrained(None, *model_args, config=config, state_dict=state, **rest)
        if adapter is not None:  # transformers loads an adapter only on top of a named checkpoint: load it here
            model.load_adapter(adapter, adapter_name=kwargs.get("adapter_name") or "default",
                               adapter_kwargs=adapter_kwargs)
        return model

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> SequenceClassifierOutput:
        kwargs.pop("return_dict", None)
        outputs = self.bert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **kwargs,
        )
        logits = self.classifier(self.dropout(masked_mean(outputs.last_hidden_state, attention_mask)))
        loss = None if labels is None else self._loss(logits, labels)
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        problem = self.config.problem_type
        if problem is None:
            integer = labels.dtype in (torch.long, torch.int)
            problem = "regression" if self.num_labels == 1 else (
                "single_label_classification" if integer else "multi_label_classification"
            )
            self.config.problem_type = problem
        if problem == "regression":
            return MSELoss()(logits.squeeze(-1), labels.squeeze(-1).to(logits.dtype))
        if problem == "single_label_classification":
            return CrossEntropyLoss()(logits.view(-1, self.num_labels), labels.view(-1))
        return BCEWithLogitsLoss()(logits, labels.to(logits.dtype))
