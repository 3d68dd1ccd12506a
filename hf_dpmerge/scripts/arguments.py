"""Command-line arguments shared by the training script (``examples/train_glue.py``) and ``hf-dpmerge audit``:
which task and base model (:class:`TaskArguments`) and which LoRA (:class:`LoraArguments`). Each field is a
flag of ``transformers.HfArgumentParser``."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path

from hf_dpmerge.data.dataset_source import DatasetSource
from hf_dpmerge.data.model_path import default_model_path
from hf_dpmerge.data.tasks import DEFAULT_TASK
from hf_dpmerge.training.shared_lora_a import DEFAULT_LORA_A_SEED
from hf_dpmerge.utils.io import require_model_source

CLASSIFIER_POOLINGS = ("mean", "cls")


@dataclass
class TaskArguments:
    task: str = field(default=DEFAULT_TASK, metadata={"help": "One task (packaged offline task or a GLUE name)."})
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Base encoder (Hub id or path); default: the packaged all-MiniLM-L6-v2."}
    )
    dataset_path: str | None = field(default=None, metadata={"help": "GLUE only: dataset repo id or local copy."})
    max_length: int = field(default=64, metadata={"help": "Truncate inputs to this many tokens."})
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Train on a seeded stratified subset of the training split of this size."}
    )
    classifier_pooling: str | None = field(
        default=None,
        metadata={"help": "'mean' (masked token mean; BERT encoders) or 'cls' (pooler). Default: mean for BERT.",
                  "choices": CLASSIFIER_POOLINGS},
    )

    def model_source(self) -> str:
        """The base encoder to load (``--model_name_or_path``, else the packaged MiniLM), refused if it is missing."""
        source = self.model_name_or_path or str(default_model_path())
        require_model_source(source)
        return source

    def with_pooling(self) -> TaskArguments:
        """A copy with ``classifier_pooling`` filled in: ``mean`` for BERT encoders, ``cls`` otherwise."""
        if self.classifier_pooling is not None:
            return self
        from hf_dpmerge.modeling import default_classifier_pooling  # imports transformers: only when needed

        return dataclasses.replace(self, classifier_pooling=default_classifier_pooling(self.model_source()))


RESERVED_RUN_NAMES = ("base", "eval")


@dataclass
class DataArguments:
    """A user's own dataset instead of ``--task`` (docs/workflow.md "Your own data"), as Hugging Face example scripts
    name the flags; :meth:`dataset_source` builds the :class:`~hf_dpmerge.data.dataset_source.DatasetSource`."""

    dataset_name: str | None = field(default=None, metadata={
        "help": "Own data: a local datasets.save_to_disk folder or a Hub dataset id (with --dataset_config_name)."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Configuration of a Hub --dataset_name."})
    train_file: str | None = field(default=None, metadata={
        "help": "Own data: training rows (csv, json, jsonl, parquet)."})
    validation_file: str | None = field(default=None, metadata={
        "help": "Own data: validation rows; without it a tenth of the training rows is held out (seeded, stratified)."})
    test_file: str | None = field(default=None, metadata={
        "help": "Own data: test rows; without it a fifth of the training rows is held out (seeded, stratified)."})
    text_column: str = field(default="text", metadata={"help": "Own data: the column holding the text."})
    text_pair_column: str | None = field(default=None, metadata={
        "help": "Own data: the second text of a sentence pair (entailment, paraphrase…)."})
    label_column: str = field(default="label", metadata={
        "help": "Own data: the class column (strings naming --label_names, or integers indexing them)."})
    label_names: str | None = field(default=None, metadata={
        "help": "Own data: the public label set, comma-separated, in head order (released in id2label). Needed "
                "unless the label column is a ClassLabel or --label_names_from_private_data is set."})
    label_names_from_private_data: bool = field(default=False, metadata={
        "help": "Own data: take the label set from the training rows. A rare label is itself private and this is "
                "not covered by ε: the record and the card say so."})
    task_name: str | None = field(default=None, metadata={
        "help": "Own data: the run's folder under --runs_dir (default: the train file's stem or the dataset's name)."})

    def dataset_source(self) -> DatasetSource | None:
        """The own dataset the flags name, or None when none is named."""
        if not (self.dataset_name or self.train_file or self.validation_file or self.test_file):
            for flag in ("dataset_config_name", "text_pair_column", "label_names", "task_name"):
                if getattr(self, flag) is not None:
                    raise ValueError(f"--{flag} describes an own dataset: pass --train_file or --dataset_name too")
            return None
        names = None
        if self.label_names is not None:
            names = tuple(name.strip() for name in self.label_names.split(",") if name.strip())
        return DatasetSource(
            dataset_name=self.dataset_name, dataset_config_name=self.dataset_config_name, train_file=self.train_file,
            validation_file=self.validation_file, test_file=self.test_file, text_column=self.text_column,
            text_pair_column=self.text_pair_column, label_column=self.label_column, label_names=names,
            label_names_from_private_data=self.label_names_from_private_data)

    def own_task_name(self) -> str:
        """``--task_name``, else the train file's stem or the dataset name's last part; a plain folder name."""
        source = self.train_file or self.dataset_name or ""
        name = self.task_name or (Path(source).stem if self.train_file else Path(source.rstrip("/")).name)
        if not name or name.startswith(".") or "/" in name or "\\" in name or name in RESERVED_RUN_NAMES:
            raise ValueError(f"--task_name {name!r} cannot name a run folder (not {', '.join(RESERVED_RUN_NAMES)}, "
                             "no path separator or leading dot): pass another --task_name")
        return name


@dataclass
class LoraArguments:
    lora_r: int = field(default=8, metadata={"help": "LoRA rank r."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha (scaling s = α/r)."})
    lora_target_modules: str = field(default="query,value", metadata={"help": "Comma-separated modules given LoRA."})
    lora_layers: str = field(
        default="top_half",
        metadata={"help": "Layers that get LoRA: 'top_half' (backprop stops halfway: faster steps, fewer noisy "
                  "coordinates), 'top_K' (the top K layers, e.g. top_1), 'all', or comma-separated indices."},
    )
    lora_freeze_a: bool = field(
        default=False,
        metadata={"help": "FFA-LoRA: draw every LoRA A from the public --lora_a_seed and freeze it; only B and the "
                  "head are trained and noised, and adapters with the same seed share A (docs/design.md §15.2)."},
    )
    lora_a_seed: int = field(
        default=DEFAULT_LORA_A_SEED,
        metadata={"help": "Public seed of the frozen A factors (--lora_freeze_a); recorded in dp_privacy.json."},
    )

    cache_prefix: str = field(
        default="auto",
        metadata={"help": "Train the top on cached states of the frozen bottom (the layers below the lowest LoRA "
                  "layer; the head's input with --train_lora false): 'auto' (whenever the bottom is frozen), 'true' "
                  "(refused when it is not) or 'false'. The same mechanism, computed once per example in "
                  "evaluation mode (docs/design.md §16).", "choices": ("auto", "true", "false")},
    )
    cache_dtype: str = field(
        default="float16",
        metadata={"help": "Storage of the cached states (computed in float32).",
                  "choices": ("float16", "bfloat16", "float32")},
    )

    prefix_cache_dir: str | None = field(
        default=None,
        metadata={"help": "Keep the cached prefix on disk in this directory and reuse it in later runs on the same "
                  "tokenised data, base, boundary and --cache_dtype (a DP and a non-private run, another ε, a "
                  "recipe search). It holds activations of the private training data: keep it where that data "
                  "is, never inside a release (docs/design.md §16)."},
    )

    def trainer_options(self) -> dict:
        """The keyword arguments of ``dp_trainer`` these flags set."""
        return {"cache_prefix": self.cache_prefix, "cache_dtype": self.cache_dtype,
                "prefix_cache_dir": self.prefix_cache_dir}

    def lora_options(self) -> dict:
        """The keyword arguments of ``lora_sequence_classifier`` / ``lora_causal_lm`` these flags set."""
        return {"r": self.lora_r, "alpha": self.lora_alpha, "target_modules": self.lora_target_modules.split(","),
                "layers": self.lora_layers, "freeze_a": self.lora_freeze_a, "a_seed": self.lora_a_seed}


def add_dataclass_flag(parser, kind: type, name: str) -> None:
    """Add ``--name`` to an argparse ``parser`` with the type, default, choices and help of field ``name`` of the
    dataclass ``kind`` (one source for a flag that a verb shares with the training script)."""
    item = {f.name: f for f in dataclasses.fields(kind)}[name]
    hint = typing.get_type_hints(kind)[name]  # not item.type: a string here, or a class once HfArgumentParser ran
    value_type = next((t for t in typing.get_args(hint) if t is not type(None)), hint)
    default = "" if item.default in (None, dataclasses.MISSING) else f" (default: {item.default})"
    parser.add_argument(f"--{name}", type=value_type, default=item.default,
                        choices=item.metadata.get("choices"), help=item.metadata.get("help", "") + default)


def flags_help(*types: type) -> str:
    """One line per field of the ``types`` dataclasses: ``--name (default): help``."""
    lines = []
    for kind in types:
        for item in dataclasses.fields(kind):
            default = "" if item.default in (None, dataclasses.MISSING) else f" (default: {item.default})"
            lines.append(f"  --{item.name}{default}: {item.metadata.get('help', '')}")
    return "\n".join(lines)
