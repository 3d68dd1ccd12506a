"""What a release may hold, and how one is written: the allow-list ``RELEASE_ALLOW_LIST`` (shared by an adapter's
release, :mod:`hf_dpmerge.training.release`, and a merged model's Hub upload, :mod:`hf_dpmerge.hub.push`) and
:func:`release_adapter`, which writes a release so that its weights and ``dp_privacy.json`` appear together or no
record appears. The release is written into a scratch directory beside the target
(:func:`~hf_dpmerge.utils.io.staged_directory`), unlisted files (``training_args.bin``, which holds ``dp_seed``) are
dropped, then it replaces a missing or empty target by one rename, or enters a non-empty one file by file, the old
record removed first and the new one moved in last. Replacing a release needs ``overwrite``; weights holding NaN or
inf are never released (docs/design.md §10).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from hf_dpmerge.records.noise_record import NOISE_STATS_NAME
from hf_dpmerge.records.record import PRIVACY_RECORD_NAME
from hf_dpmerge.records.selection_record import SELECTION_RECORD_NAME
from hf_dpmerge.utils.adapter_files import ADAPTER_CONFIG_NAME, ADAPTER_SAFETENSORS_NAME
from hf_dpmerge.utils.io import staged_directory

if TYPE_CHECKING:
    import torch

REMOTE_CODE_FILE = "modeling_mean_pooling_bert.py"  # the file hf_dpmerge/modeling/ ships as a release's remote code
UNIFIED_DELTA_FILE = "unified_delta.safetensors"  # an emr release's root: δ_uni, which its task modulators scale
TASK_MODULATOR_FILE = "task_modulator.safetensors"  # an emr release's <task>/: the task's packed masks and rescaler

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
    # an emr merge's unified delta (root) and per-task modulators: functions of the released adapters and the merge
    UNIFIED_DELTA_FILE, f"*/{TASK_MODULATOR_FILE}",
    # task models for stock loaders, one folder level down: a merged release's <task>/ (its head alone when the
    # encoder is staged once at the root, hf_dpmerge.modeling.stock_release.HEAD_WEIGHTS_FILE), and a multi-adapter
    # release's <task>/ adapter (LoRA + head) on the base at the root (hf_dpmerge.hub.multi_adapter)
    *(f"*/{name}" for name in (
        "model.safetensors", "head.safetensors", "config.json", REMOTE_CODE_FILE, "tokenizer.json",
        "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", PRIVACY_RECORD_NAME,
        ADAPTER_CONFIG_NAME, ADAPTER_SAFETENSORS_NAME,
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


RELEASE_FILES = (PRIVACY_RECORD_NAME, ADAPTER_CONFIG_NAME, ADAPTER_SAFETENSORS_NAME)


def keep_release_files(directory: str | os.PathLike) -> list[str]:
    """Delete from ``directory`` every file the allow-list does not name (and emptied folders); returns them."""
    root = Path(directory)
    removed = unlisted_files(root)
    for rel in removed:
        (root / rel).unlink()
    for folder in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()
    return removed


def check_finite_weights(names: Sequence[str], params: Sequence[torch.Tensor]) -> None:
    """Refuse to release weights holding NaN or inf, naming the first such parameter."""
    import torch  # the allow-list's readers (hub staging) need no torch

    for name, param in zip(names, params):
        if not bool(torch.isfinite(param).all()):
            raise FloatingPointError(f"{name} holds NaN or infinite values: the adapter is not released")


def _move_into(staged: Path, target: Path) -> None:
    """Move the staged release into a non-empty ``target``: old record out first, new record in last."""
    (target / PRIVACY_RECORD_NAME).unlink(missing_ok=True)
    for item in sorted(staged.iterdir()):
        if item.name == PRIVACY_RECORD_NAME:
            continue
        destination = target / item.name
        if item.is_dir() and destination.is_dir():
            shutil.rmtree(destination)
        os.replace(item, destination)
    os.replace(staged / PRIVACY_RECORD_NAME, target / PRIVACY_RECORD_NAME)
    staged.rmdir()


def check_release_target(target: str | os.PathLike, overwrite: bool = False) -> None:
    """Refuse a file, or a directory holding a release unless ``overwrite`` (scripts call it before training)."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"adapter output {target} exists and is not a directory")
    previous = [name for name in RELEASE_FILES if (target / name).exists()]
    if previous and not overwrite:
        raise FileExistsError(
            f"{target} already holds a released adapter ({', '.join(previous)}); pass overwrite=True to replace it"
        )


def release_adapter(target: str | os.PathLike, write: Callable[[Path], None], overwrite: bool = False) -> Path:
    """Run ``write(directory)`` (adapter files and ``dp_privacy.json``) and put the result at ``target``."""
    target = Path(target)
    check_release_target(target, overwrite)
    with staged_directory(target) as staged:
        staged.mkdir()
        write(staged)
        keep_release_files(staged)
        if target.is_dir() and any(target.iterdir()):
            _move_into(staged, target)
    return target
