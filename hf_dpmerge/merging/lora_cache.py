"""mergekit's ``--lora-merge-cache``: entries older than their inputs, or incomplete, are dropped before a merge."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

from mergekit.config import MergeConfiguration


def _complete_model_dir(directory: Path) -> bool:
    """config.json, every shard the index names, and each safetensors file whole (a killed write is not)."""
    from safetensors import SafetensorError, safe_open

    index = directory / "model.safetensors.index.json"
    if index.exists():
        shards = [directory / name for name in set(json.loads(index.read_text())["weight_map"].values())]
    else:
        shards = list(directory.glob("*.safetensors"))
    if not (directory / "config.json").exists() or not shards or not all(s.exists() for s in shards):
        return False
    for shard in shards:
        try:
            with safe_open(shard, "pt"):
                pass
        except SafetensorError:
            return False
    return True


def drop_stale_lora_merges(config: MergeConfiguration, cache_dir: str) -> None:
    """Drop ``--lora-merge-cache`` entries older than their inputs, or incomplete, so mergekit rebuilds them.

    mergekit keys each base+adapter merge by path only: an adapter retrained in place would otherwise be
    merged in its old state.
    """
    for reference in config.referenced_models():
        if not reference.lora:
            continue
        entry = Path(cache_dir) / f"{reference.model._unique_id()}_{reference.lora._unique_id()}"
        if not entry.is_dir():
            continue
        sources = [f for d in (reference.model.path, reference.lora.path) if os.path.isdir(d)
                   for f in Path(d).iterdir() if f.is_file()]
        built = [f.stat().st_mtime_ns for f in entry.iterdir() if f.suffix == ".safetensors"]
        stale = any(f.stat().st_mtime_ns > min(built) for f in sources) if built else True
        if stale or not _complete_model_dir(entry):
            warnings.warn(f"{entry}: stale or incomplete LoRA merge cache entry for {reference}; rebuilding it",
                          stacklevel=2)
            shutil.rmtree(entry)
