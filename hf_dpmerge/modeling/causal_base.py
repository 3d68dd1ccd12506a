"""A causal language model as a plain float32 checkpoint that stock transformers, peft and mergekit read.

A GGUF file (the packaged SmolLM2) loads through transformers' ``gguf`` support, dequantised to float32, but
``save_pretrained`` refuses a GGUF-loaded model; its state dict copied into a fresh model of the same config
gives an ordinary checkpoint (its config without the GGUF ``quantization_config``: the weights are float32 now),
which later loads without the ``gguf`` package. A Hub id or local directory is
loaded and saved as float32 (DP training needs float32 trainable weights; docs/design.md §14).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch


def load_causal_lm(source: str | os.PathLike):
    """(model in float32, tokenizer) from a ``.gguf`` file, a local directory or a Hub id."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(source)
    if path.suffix == ".gguf":
        try:
            import gguf  # noqa: F401
        except ImportError:
            raise ImportError(f"{path.name} is a GGUF file, which transformers reads with the gguf package: "
                              "pip install 'hf_dpmerge[causal]' (or pip install gguf)") from None
        location = {"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name}
        tokenizer = AutoTokenizer.from_pretrained(**location)
        loaded = AutoModelForCausalLM.from_pretrained(**location, dtype=torch.float32)
        config = copy.deepcopy(loaded.config)
        if hasattr(config, "quantization_config"):  # dequantised: Trainer refuses to train a "GGUF-quantized" model
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.generation_config = loaded.generation_config
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(source))
        model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
    if tokenizer.pad_token is None:  # batches are padded; pad positions are masked and carry no loss
        tokenizer.pad_token = tokenizer.eos_token
    return model.eval(), tokenizer


def save_causal_base(source: str | os.PathLike, directory: str | os.PathLike) -> None:
    """Write ``source`` into ``directory`` as a float32 checkpoint with its tokenizer."""
    model, tokenizer = load_causal_lm(source)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
