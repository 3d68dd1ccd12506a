"""Mean-pooling BERT sequence classifier, as remote code for stock transformers (``trust_remote_code=True``).

This file is copied verbatim next to ``config.json`` in every release (``auto_map`` points at it), so it
imports torch and transformers only — never hf_dpmerge. The classifier reads the masked token mean

    h̄ = Σ_t m_t·h_t / max(Σ_t m_t, 1)        (m = attention mask, h_t = last hidden states)

instead of the [CLS] → pooler path (docs/design.md §10). A release's ``model_type`` is
``mean_pooling_bert``, which transformers does not know: without ``trust_remote_code=True`` stock loaders
refuse it loudly rather than fall back to [CLS] pooling and compute another function.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import BCEWithLogitsLoss, CrossEntropyLoss, MSELoss
from transformers import BertConfig, BertForSequenceClassification
from transformers.modeling_outputs import SequenceClassifierOutput


class MeanPoolingBertConfig(BertConfig):
    """``BertConfig`` under its own ``model_type``, so stock Auto classes need the remote code to load it."""

    model_type = "mean_pooling_bert"


def masked_mean(hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """h̄ = Σ_t m_t·h_t / max(Σ_t m_t, 1) over the sequence axis (all tokens when no mask is given)."""
    if attention_mask is None:
        return hidden_states.mean(dim=1)
    mask = attention_mask.unsqueeze(-1).to(hidden_states.dtype)
    return (hidden_states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


class MeanPoolingBertForSequenceClassification(BertForSequenceClassification):
    """``BertForSequenceClassification`` whose classifier reads the masked token mean instead of [CLS]."""

    config_class = MeanPoolingBertConfig

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
