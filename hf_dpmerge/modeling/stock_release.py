"""Released task models that stock transformers and peft load as the same function hf_dpmerge computes.

Training, merging and evaluation keep plain ``bert`` checkpoints with ``classifier_pooling: "mean"``, which stock
classes ignore (they read the [CLS] pooler). A release therefore uses the Hub's convention for a custom head:
``model_type: "mean_pooling_bert"`` with an ``auto_map`` to ``modeling_mean_pooling_bert.py`` beside
``config.json``, and ``id2label``/``label2id`` from the task; a ``cls``-pooling model is a stock class already. A
task adapter (``runs/<task>/adapter/``) is its own base: beside the adapter's files it holds the release config
and head, and for mean pooling takes the encoder from ``runs/base/`` (``shared_encoder_weights:
"../../base/model.safetensors"``), so ``AutoModelForSequenceClassification.from_pretrained(path,
trust_remote_code=True)`` loads it from anywhere; ``adapter_config.json`` names its base ``"."`` (no path of the
training machine). See docs/design.md §10.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import PreTrainedModel

from hf_dpmerge.modeling import modeling_mean_pooling_bert as remote_code
from hf_dpmerge.modeling.mean_pooling import CLASSIFIER_POOLING_KEY, load_sequence_classifier
from hf_dpmerge.modeling.task_head import attach_head, task_head_state
from hf_dpmerge.modeling.task_modulator import save_task_modulator
from hf_dpmerge.utils.adapter_files import ADAPTER_BASE_DIR, set_adapter_base
from hf_dpmerge.utils.io import apply_open_modes
from hf_dpmerge.utils.quiet import transformers_errors_only

REMOTE_CODE_FILE = Path(remote_code.__file__).name  # records.release_files allow-lists it by this name
REMOTE_MODEL_TYPE = remote_code.MeanPoolingBertConfig.model_type
HEAD_WEIGHTS_FILE = remote_code.HEAD_WEIGHTS_FILE  # records.release_files allow-lists it as */head.safetensors
SHARED_ENCODER_FILE = "model.safetensors"  # a release's root: the merged encoder, staged once for every task
UNIFIED_DELTA_FILE = "unified_delta.safetensors"  # an emr release's root: δ_uni (records.release_files allow-lists it)
TASK_MODULATOR_FILE = "task_modulator.safetensors"  # an emr release's <task>/ modulator (allow-listed there too)
_MODULE = REMOTE_CODE_FILE.removesuffix(".py")
AUTO_MAP = {
    "AutoConfig": f"{_MODULE}.{remote_code.MeanPoolingBertConfig.__name__}",
    "AutoModelForSequenceClassification": f"{_MODULE}.{remote_code.MeanPoolingBertForSequenceClassification.__name__}",
}
LEGACY_BASE_DIR = "base"  # where releases before the adapter folder was its own base kept it
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def stock_config(config: dict[str, Any], label_names: Sequence[str]) -> dict[str, Any]:
    """``config`` (a ``config.json`` dict) with the task's labels and, for mean pooling, the remote code."""
    config = dict(config)
    config.update(
        num_labels=len(label_names),
        id2label={str(i): name for i, name in enumerate(label_names)},
        label2id={name: i for i, name in enumerate(label_names)},
    )
    if config.get(CLASSIFIER_POOLING_KEY) == "mean":
        config.update(
            model_type=REMOTE_MODEL_TYPE,
            architectures=[remote_code.MeanPoolingBertForSequenceClassification.__name__],
            auto_map=dict(AUTO_MAP),
        )
    return config


def save_stock_classifier(model: PreTrainedModel, directory: str | os.PathLike, label_names: Sequence[str]) -> None:
    """Save ``model``'s weights with the release ``config.json`` (and the remote code when it mean-pools)."""
    directory = Path(directory)
    model.save_pretrained(directory)
    config_path = directory / "config.json"
    config = stock_config(json.loads(config_path.read_text()), label_names)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if config.get("model_type") == REMOTE_MODEL_TYPE:
        shutil.copyfile(remote_code.__file__, directory / REMOTE_CODE_FILE)
    apply_open_modes(directory)  # save_pretrained's safetensors file is 0600


def copy_tokenizer(source: str | os.PathLike, directory: str | os.PathLike) -> None:
    """Copy the tokenizer files ``source`` has (pipelines read the tokenizer beside the model)."""
    for name in TOKENIZER_FILES:
        if (Path(source) / name).is_file():
            shutil.copyfile(Path(source) / name, Path(directory) / name)


def head_num_labels(head: Mapping[str, Any]) -> int:
    """The outputs of a task head: its ``out_proj`` rows (RoBERTa-style heads), else its smallest weight matrix's."""
    matrices = {k: v for k, v in head.items() if k.endswith("weight") and v.ndim == 2}
    out_proj = [k for k in matrices if k.endswith("out_proj.weight")]
    return int(matrices[out_proj[0]].shape[0]) if out_proj else int(min(v.shape[0] for v in matrices.values()))


def _names(source: Any) -> list[str] | None:
    """Label names from a list of names or an ``id2label`` mapping (keys are indices), else None."""
    if isinstance(source, list) and source and all(isinstance(x, str) for x in source):
        return list(source)
    if isinstance(source, dict) and source:
        try:
            return [str(source[k]) for k in sorted(source, key=int)]
        except (TypeError, ValueError):
            return None
    return None


def release_label_names(adapter_dir: str | os.PathLike, record_extra: Mapping[str, Any],
                        *fallbacks: Sequence[str] | None, head: Mapping[str, Any] | None = None) -> list[str]:
    """The label names a release gives a task's head: the first of the record's ``label_names`` (training saves
    them), its ``id2label``, the adapter's ``config.json`` ``id2label`` and ``fallbacks`` (e.g. the task's) that
    has as many names as the head (``head``: its tensors, when already read) has outputs, else ``LABEL_i``."""
    adapter_dir = Path(adapter_dir)
    candidates: list[Any] = [record_extra.get("label_names"), record_extra.get("id2label")]
    config = adapter_dir / "config.json"
    if config.is_file():
        try:
            candidates.append(json.loads(config.read_text()).get("id2label"))
        except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            pass
    rows = head_num_labels(task_head_state(adapter_dir) if head is None else head)
    for names in [*map(_names, candidates), *fallbacks]:
        if names and len(names) == rows:
            return [str(name) for name in names]
    return [f"LABEL_{i}" for i in range(rows)]


def task_model(
    encoder_dir: str | os.PathLike, adapter_dir: str | os.PathLike, label_names: Sequence[str]
) -> PreTrainedModel:
    """``encoder_dir``'s weights with the head saved in ``adapter_dir`` (its ``modules_to_save``)."""
    with transformers_errors_only():  # its load report of the re-created head, replaced right below
        model = load_sequence_classifier(
            encoder_dir, num_labels=len(label_names), ignore_mismatched_sizes=True,
            id2label=dict(enumerate(label_names)), label2id={n: i for i, n in enumerate(label_names)},
        )
    attach_head(model, task_head_state(adapter_dir), source=str(adapter_dir))
    return model.eval()


def write_task_model(
    encoder_dir: str | os.PathLike, adapter_dir: str | os.PathLike, label_names: Sequence[str],
    directory: str | os.PathLike,
) -> None:
    """A merged model's task folder for stock loaders: ``encoder_dir``'s weights with the adapter's head, the
    release config and the tokenizer."""
    save_stock_classifier(task_model(encoder_dir, adapter_dir, label_names), directory, label_names)
    copy_tokenizer(encoder_dir, directory)


def shares_encoder(encoder_dir: str | os.PathLike) -> bool:
    """Whether task folders of ``encoder_dir``'s model can take their encoder from one shared file: the release
    class is the remote code (mean pooling), whose ``from_pretrained`` reads ``shared_encoder_weights``."""
    config = json.loads((Path(encoder_dir) / "config.json").read_text())
    return config.get(CLASSIFIER_POOLING_KEY) == "mean"


def write_unified_delta(unified: Mapping[str, torch.Tensor], path: str | os.PathLike) -> None:
    """An emr release's δ_uni (:mod:`hf_dpmerge.analysis.emr_modulation`) in one safetensors file at its root."""
    save_file({name: delta.contiguous() for name, delta in unified.items()}, str(path), metadata={"format": "pt"})
    apply_open_modes(path)  # safetensors writes 0600


def write_shared_encoder(encoder_dir: str | os.PathLike, path: str | os.PathLike) -> None:
    """``encoder_dir``'s weights without its classifier, in one safetensors file (a release's root)."""
    model = load_sequence_classifier(encoder_dir)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()
             if not k.startswith(remote_code.HEAD_PREFIX)}
    save_file(state, str(path), metadata={"format": "pt"})
    apply_open_modes(path)  # safetensors writes 0600


def write_stock_base(base_dir: str | os.PathLike, directory: str | os.PathLike) -> None:
    """``base_dir``'s encoder as the stock base of adapters that bring their own heads (``modules_to_save``): its
    release config (for mean pooling the remote code, copied beside it), its weights without the placeholder head
    (loaded alone, transformers initialises a fresh one and says so) and the tokenizer."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = json.loads((Path(base_dir) / "config.json").read_text())
    labels = _names(config.get("id2label")) or [f"LABEL_{i}" for i in range(int(config.get("num_labels", 2)))]
    config = stock_config(config, labels)
    write_shared_encoder(base_dir, directory / SHARED_ENCODER_FILE)
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if config.get("model_type") == REMOTE_MODEL_TYPE:
        shutil.copyfile(remote_code.__file__, directory / REMOTE_CODE_FILE)
    copy_tokenizer(base_dir, directory)


def write_task_head_folder(
    encoder_dir: str | os.PathLike, head: Mapping[str, torch.Tensor], label_names: Sequence[str],
    directory: str | os.PathLike, shared_encoder: str,
    modulator: tuple[Mapping[str, torch.Tensor], float] | None = None, unified_delta: str | None = None,
) -> None:
    """A task folder that takes its encoder from ``shared_encoder`` (a path relative to ``directory``): the release
    config naming it, ``head`` (an adapter's :func:`task_head_state`) in ``head.safetensors``, the remote code and
    the tokenizer. Stock ``from_pretrained(..., trust_remote_code=True)`` loads it as :func:`write_task_model`'s
    folder. An emr release's task also gets its ``modulator`` (masks, rescaler) in ``task_modulator.safetensors``,
    its config naming that file and the root's ``unified_delta`` (relative to ``directory``)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = stock_config(json.loads((Path(encoder_dir) / "config.json").read_text()), label_names)
    if config.get("model_type") != REMOTE_MODEL_TYPE:
        raise ValueError(f"{encoder_dir} is not a mean-pooling model: its task folders need their own weights")
    config[remote_code.SHARED_ENCODER_KEY] = shared_encoder
    weight, bias = f"{remote_code.HEAD_PREFIX}weight", f"{remote_code.HEAD_PREFIX}bias"
    if sorted(head) != [bias, weight]:
        raise ValueError(f"{directory.name}: the head {sorted(head)} is not a BERT classifier")
    if head[weight].shape[0] != len(label_names):
        raise ValueError(f"{directory.name}: the head has {head[weight].shape[0]} outputs for {len(label_names)} "
                         "labels")
    save_file(dict(head), str(directory / HEAD_WEIGHTS_FILE), metadata={"format": "pt"})
    if modulator is not None:
        save_task_modulator(directory / TASK_MODULATOR_FILE, *modulator)
        config[remote_code.TASK_MODULATOR_KEY] = TASK_MODULATOR_FILE
        config[remote_code.UNIFIED_DELTA_KEY] = unified_delta
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    shutil.copyfile(remote_code.__file__, directory / REMOTE_CODE_FILE)
    copy_tokenizer(encoder_dir, directory)
    apply_open_modes(directory)  # safetensors writes 0600


def make_adapter_stock_loadable(
    adapter_dir: str | os.PathLike, base_dir: str | os.PathLike, label_names: Sequence[str],
    shared_encoder: str | None = None,
) -> None:
    """Make ``adapter_dir`` its own base for stock loaders and point ``base_model_name_or_path`` at it (``"."``).
    ``shared_encoder``: ``base_dir``'s weights file as a path relative to ``adapter_dir`` (the runs layout's
    ``../../base/model.safetensors``): a mean-pooling base then holds the task's config and head and takes its
    encoder from there; otherwise (or for a [CLS]-pooling base) it is ``base_dir``'s weights with the task's head,
    whole. The stock base of an earlier release of this adapter is replaced (and a ``base/`` folder, where releases
    of earlier versions kept it, removed)."""
    adapter_dir, base_dir = Path(adapter_dir), Path(base_dir)
    if (adapter_dir / LEGACY_BASE_DIR / "config.json").is_file():
        shutil.rmtree(adapter_dir / LEGACY_BASE_DIR)
    for name in (HEAD_WEIGHTS_FILE, SHARED_ENCODER_FILE, REMOTE_CODE_FILE):  # the other layout's files
        (adapter_dir / name).unlink(missing_ok=True)
    if shared_encoder is not None and shares_encoder(base_dir):
        write_task_head_folder(base_dir, task_head_state(adapter_dir), label_names, adapter_dir, shared_encoder)
    else:
        save_stock_classifier(task_model(base_dir, adapter_dir, label_names), adapter_dir, label_names)
        copy_tokenizer(base_dir, adapter_dir)
    set_adapter_base(adapter_dir, ADAPTER_BASE_DIR)
