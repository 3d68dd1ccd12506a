"""A tiny runs layout built in-process, as training and mergekit would write it (for analysis tests)."""

from __future__ import annotations

import math
from pathlib import Path

import torch
import yaml
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForSequenceClassification

from hf_dpmerge.records.record import PrivacyRecord
from hf_dpmerge.training.encoder_adapter import export_encoder_adapter
from tests.utils.records import privacy_record
from tests.utils.tiny_models import save_tiny_bert

MAX_LENGTH = 32


def runs_record(task: str, epsilon: float = 8.0, dp: bool = True, **extra) -> PrivacyRecord:
    """The record of a fake run: the PRV accountant (none without DP), ``extra`` as the record's extra fields."""
    return privacy_record(
        task, epsilon, delta=1e-5 if dp else 0.0, accountant="prv" if dp else "none", noise_multiplier=0.8,
        effective_noise_multiplier=0.8, sample_rate=0.01, steps=10, expected_batch_size=16, num_samples=1000,
        optimizer={"name": "adamw"}, sum_lr_squared=1e-4, base_model=None, versions={}, dp=dp, extra=dict(extra),
    )


def save_fake_adapter(base: Path, out: Path, num_labels: int, seed: int) -> torch.nn.Module:
    """A LoRA adapter with non-zero deltas and its own head, as training would save it."""
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=num_labels,
                                                               ignore_mismatched_sizes=True)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], modules_to_save=["classifier"],
                        task_type="SEQ_CLS")
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                param.normal_(0, 0.5)
    peft_model.save_pretrained(out)
    return peft_model


def save_scored_runs(runs: Path, tasks: dict[str, int]) -> Path:
    """``runs/base`` and, for the i-th task (from 1, that many labels), an adapter seeded i, its record (max_length
    within the tiny BERT's positions) and its encoder export: runs whose merges can be scored on their splits."""
    base = save_tiny_bert(runs / "base", num_labels=2, seed=0)
    for seed, (task, labels) in enumerate(tasks.items(), start=1):
        save_fake_adapter(base, runs / task / "adapter", labels, seed)
        runs_record(task, max_length=MAX_LENGTH).save(runs / task / "adapter")
        export_encoder_adapter(runs / task / "adapter", runs / task / "encoder_adapter")
    return runs


def fake_merge_config(weights: dict[str, float]) -> str:
    """A ``mergekit_config.yml`` merging the fake runs' adapters (run folder → weight) by task arithmetic."""
    models = [{"model": f"runs/base+runs/{name}/adapter", "parameters": {"weight": weight}}
              for name, weight in weights.items()]
    return yaml.safe_dump({"merge_method": "task_arithmetic", "base_model": "runs/base", "models": models},
                          sort_keys=False)


def build_fake_runs(root: Path) -> dict[str, Path]:
    """runs/base (2 labels), bbc (bbc_news, 5 labels, DP) and election_tweets (2 labels, non-private) adapters;
    merged = base + bbc_news's LoRA with a meaningless 2-label head (so bbc_news must be reproduced exactly), and the
    mergekit_config.yml that says so (election_tweets at weight 0)."""
    runs_dir = root / "runs"
    base = save_tiny_bert(runs_dir / "base", num_labels=2, seed=0)
    bbc = save_fake_adapter(base, runs_dir / "bbc" / "adapter", num_labels=5, seed=1)
    runs_record("bbc_news", epsilon=4.0, max_length=MAX_LENGTH).save(runs_dir / "bbc" / "adapter")
    save_fake_adapter(base, runs_dir / "election_tweets" / "adapter", num_labels=2, seed=2)
    runs_record("election_tweets", epsilon=math.inf, dp=False).save(runs_dir / "election_tweets" / "adapter")

    merged_encoder = bbc.merge_and_unload()
    merged = AutoModelForSequenceClassification.from_pretrained(base, num_labels=2)
    encoder_state = {k: v for k, v in merged_encoder.state_dict().items() if not k.startswith("classifier")}
    merged.load_state_dict(encoder_state, strict=False)
    torch.nn.init.normal_(merged.classifier.weight, std=3.0)
    merged.save_pretrained(root / "merged")
    (root / "merged" / "mergekit_config.yml").write_text(fake_merge_config({"bbc": 1.0, "election_tweets": 0.0}))
    return {"runs": runs_dir, "base": base, "merged": root / "merged"}
