"""Builders shared by the training tests: a tiny LoRA classifier, a tokenised dataset, a trainer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import DataCollatorWithPadding

from hf_dpmerge import DPSAMConfig, DPSAMTrainer
from tests.utils.tiny_models import CORPUS, tiny_bert, tiny_gpt2, tiny_tokenizer


def lora_classifier(seed: int = 0, num_labels: int = 2, dropout: float = 0.0, **lora_kwargs: Any):
    """A tiny BERT classifier (``dropout`` in its layers) with LoRA r=4 on query/value and a trained head."""
    config = dict(r=4, lora_alpha=8, target_modules=["query", "value"], modules_to_save=["classifier"],
                  task_type="SEQ_CLS")
    config.update(lora_kwargs)
    return get_peft_model(tiny_bert(num_labels=num_labels, seed=seed, dropout=dropout), LoraConfig(**config))


def lora_causal_lm():
    """A tiny GPT-2 with LoRA r=2 on its fused ``c_attn`` (a Conv1D: fan_in_fan_out)."""
    return get_peft_model(tiny_gpt2(), LoraConfig(r=2, target_modules=["c_attn"], task_type="CAUSAL_LM",
                                                  fan_in_fan_out=True))


def dora_classifier():
    """A tiny BERT classifier with DoRA (LoRA with magnitude vectors) r=2 on query."""
    return get_peft_model(tiny_bert(), LoraConfig(r=2, target_modules=["query"], use_dora=True, task_type="SEQ_CLS"))


def text_dataset(copies: int = 25) -> Dataset:
    tok = tiny_tokenizer()
    texts = CORPUS * copies
    ds = Dataset.from_dict({"text": texts, "label": [i % 2 for i in range(len(texts))]})
    return ds.map(lambda batch: tok(batch["text"]), batched=True)


def lm_dataset(texts: list[str]) -> Dataset:
    """``texts`` tokenised for causal language modelling (no label column: the collator makes the labels)."""
    tok = tiny_tokenizer()
    return Dataset.from_dict({"text": texts}).map(lambda batch: tok(batch["text"]), batched=True,
                                                  remove_columns=["text"])


UNITS = 40  # unit_dataset(): author u holds rows u, u+40, u+80, u+120, u+160 of text_dataset()


def unit_dataset() -> Dataset:
    ds = text_dataset()
    return ds.add_column("author", [f"author-{i % UNITS}" for i in range(len(ds))])


def trainer_config(tmp_path, **overrides: Any) -> DPSAMConfig:
    """The tests' small DP configuration (4 steps, B_exp = 20, rdp, seeded), with ``overrides``."""
    settings = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=20,
        physical_batch_size=8,
        max_steps=4,
        learning_rate=1e-2,
        report_to="none",
        accountant="rdp",
        target_epsilon=4.0,
        dp_seed=0,
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
    )
    settings.update(overrides)
    return DPSAMConfig(**settings)


def silenced(build: Callable[..., Any], overrides: dict[str, Any]) -> Any:
    """``build(**overrides)``; with ``noise_multiplier=0.0`` (no DP, which DPSAMConfig refuses) the trainer is
    built private and its privatizer then silenced, so a released query is the clipped sum alone."""
    silent = overrides.get("noise_multiplier") == 0.0
    trainer = build(**{**overrides, "noise_multiplier": 1.0} if silent else overrides)
    if silent:
        trainer.privatizer.noise_multiplier = 0.0
    return trainer


def make_trainer(tmp_path, model=None, dataset=None, **overrides: Any) -> DPSAMTrainer:
    return silenced(lambda **settings: DPSAMTrainer(
        model=model if model is not None else lora_classifier(),
        args=trainer_config(tmp_path, **settings),
        train_dataset=dataset if dataset is not None else text_dataset(),
        data_collator=DataCollatorWithPadding(tiny_tokenizer()),
    ), overrides)


def collate(trainer: DPSAMTrainer, rows: list[int]) -> dict:
    dataset = trainer.train_dataset.remove_columns(["text"])
    return trainer._prepare_inputs(trainer.data_collator([dataset[i] for i in rows]))


def head_only_classifier(seed: int = 0):
    """:func:`lora_classifier` with its LoRA factors frozen (B = 0): only the task head trains."""
    model = lora_classifier(seed=seed)
    for name, parameter in model.named_parameters():
        if ".lora_" in name:
            parameter.requires_grad_(False)
    return model


def make_cached_trainer(tmp_path, model=None, dataset=None, **overrides: Any):
    """A :class:`CachedPrefixTrainer` (float32 cache) on ``dataset`` (default :func:`text_dataset`) under ``model``
    (default :func:`head_only_classifier`: the cached rows are the head's pooled input), with :func:`make_trainer`'s
    settings."""
    from hf_dpmerge.training.cached_prefix import CachedPrefixTrainer

    model = model if model is not None else head_only_classifier()
    return silenced(lambda **settings: CachedPrefixTrainer(
        model=model, args=trainer_config(tmp_path, **settings), cache_dtype="float32",
        train_dataset=dataset if dataset is not None else text_dataset(),
        data_collator=DataCollatorWithPadding(tiny_tokenizer())), overrides)
