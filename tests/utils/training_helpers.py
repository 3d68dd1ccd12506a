"""Builders shared by the training tests: a tiny LoRA classifier, a tokenised dataset, a trainer."""

from __future__ import annotations

from typing import Any

from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import DataCollatorWithPadding

from hf_dpmerge import DPSAMConfig, DPSAMTrainer
from tests.utils.tiny_models import CORPUS, tiny_bert, tiny_tokenizer


def lora_classifier(seed: int = 0, num_labels: int = 2, **lora_kwargs: Any):
    config = dict(r=4, lora_alpha=8, target_modules=["query", "value"], modules_to_save=["classifier"],
                  task_type="SEQ_CLS")
    config.update(lora_kwargs)
    return get_peft_model(tiny_bert(num_labels=num_labels, seed=seed), LoraConfig(**config))


def text_dataset(copies: int = 25) -> Dataset:
    tok = tiny_tokenizer()
    texts = CORPUS * copies
    ds = Dataset.from_dict({"text": texts, "label": [i % 2 for i in range(len(texts))]})
    return ds.map(lambda batch: tok(batch["text"]), batched=True)


UNITS = 40  # unit_dataset(): author u holds rows u, u+40, u+80, u+120, u+160 of text_dataset()


def unit_dataset() -> Dataset:
    ds = text_dataset()
    return ds.add_column("author", [f"author-{i % UNITS}" for i in range(len(ds))])


def make_trainer(tmp_path, model=None, dataset=None, **overrides: Any) -> DPSAMTrainer:
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
    return DPSAMTrainer(
        model=model if model is not None else lora_classifier(),
        args=DPSAMConfig(**settings),
        train_dataset=dataset if dataset is not None else text_dataset(),
        data_collator=DataCollatorWithPadding(tiny_tokenizer()),
    )


def collate(trainer: DPSAMTrainer, rows: list[int]) -> dict:
    dataset = trainer.train_dataset.remove_columns(["text"])
    return trainer._prepare_inputs(trainer.data_collator([dataset[i] for i in rows]))
