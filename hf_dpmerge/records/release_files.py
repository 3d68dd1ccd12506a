"""What a release may hold: the allow-list of file paths (``RELEASE_ALLOW_LIST``) shared by an adapter's release
(:mod:`hf_dpmerge.training.release`) and a merged model's Hub upload (:mod:`hf_dpmerge.hub.push`)."""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path, PurePosixPath

from hf_dpmerge.records.noise_record import NOISE_STATS_NAME
from hf_dpmerge.records.record import PRIVACY_RECORD_NAME
from hf_dpmerge.records.selection_record import SELECTION_RECORD_NAME

REMOTE_CODE_FILE = "modeling_mean_pooling_bert.py"  # the file hf_dpmerge/modeling/ ships as a release's remote code

# Everything a release may hold (an adapter folder, what DPSAMTrainer.push_to_hub or `hf-dpmerge push` uploads),
# as repository paths with shell wildcards per path component. Logs, trainer_state.json, training_args.bin
# (it holds dp_seed), checkpoints, optimizer/scheduler/RNG states and dp_state.pt (the noise generator's state)
# and metrics computed on private data are left out: nothing private leaves except through the accounted
# mechanism (docs/design.md §10).
RELEASE_ALLOW_LIST = (
    # weights: a LoRA adapter, or a merged model (one file or shards with their index)
    "adapter_model.safetensors", "model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json",
    "pytorch_model.bin", "pytorch_model-*-of-*.bin", "pytorch_model.bin.index.json",
    # configurations: the adapter's, the model's, the merge recipe
    "adapter_config.json", "config.json", "generation_config.json", "mergekit_config.yml",
    # tokenizer files (copied from the public base)
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.txt",
    "vocab.json", "merges.txt", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model",
    "chat_template.jinja", "chat_template.json",
    # the privacy record, the card, and the privatised optimizer statistics the dp_aware merge reads
    PRIVACY_RECORD_NAME, "README.md", NOISE_STATS_NAME,
    # the accounted merge-hyper-parameter selection of a merged model tuned by `hf-dpmerge tune`
    SELECTION_RECORD_NAME,
    # the remote code of the mean-pooling head (hf_dpmerge.modeling.stock_release.REMOTE_CODE_FILE), and the head
    # of an adapter folder that is its own stock base, its encoder read from the runs' shared base (HEAD_WEIGHTS_FILE)
    REMOTE_CODE_FILE, "head.safetensors",
    # task models for stock loaders, one folder level down: a merged release's <task>/ (its head alone when the
    # encoder is staged once at the root, hf_dpmerge.modeling.stock_release.HEAD_WEIGHTS_FILE)
    *(f"*/{name}" for name in (
        "model.safetensors", "head.safetensors", "config.json", REMOTE_CODE_FILE, "tokenizer.json",
        "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", PRIVACY_RECORD_NAME,
    )),
)


def is_release_file(path: str) -> bool:
    """Whether the repository path ``path`` (posix, relative) matches an entry of ``RELEASE_ALLOW_LIST``."""
    parts = PurePosixPath(path).parts
    return any(
        len(parts) == len(pattern_parts) and all(map(fnmatch.fnmatchcase, parts, pattern_parts))
        for pattern_parts in (PurePosixPath(p).parts for p in RELEASE_ALLOW_LIST)
    )


def unlisted_files(directory: str | os.PathLike) -> list[str]:
    """Files under ``directory`` (relative posix paths) that no entry of ``RELEASE_ALLOW_LIST`` allows."""
    root = Path(directory)
    return [
        rel for rel in (p.relative_to(root).as_posix() for p in sorted(root.rglob("*")) if p.is_file())
        if not is_release_file(rel)
    ]
