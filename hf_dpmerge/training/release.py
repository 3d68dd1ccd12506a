"""Releasing an adapter: its weights and its ``dp_privacy.json`` appear together, or no record appears.

A release holds only the files of ``RELEASE_ALLOW_LIST`` (weights, adapter/model configuration, tokenizer
files, the privacy record and the card); anything else the writer produced (Trainer's ``training_args.bin``,
which holds ``dp_seed``) is dropped before the release appears.

The release is written into a scratch directory beside the target first
(:func:`~hf_dpmerge.merging.staging.staged_directory`). A missing or empty target is then replaced by a
single rename. A non-empty target (e.g. a run's ``output_dir``, which holds its checkpoints) receives the
files one atomic rename each: its old ``dp_privacy.json`` is removed first and the new one is moved in last,
so a process killed half-way leaves a directory without a record, which merging, evaluation and push refuse.
A target that already holds a release is replaced only on request, and weights holding NaN or inf are never
released.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath

import torch

from hf_dpmerge.merging.staging import staged_directory
from hf_dpmerge.modeling.stock_release import REMOTE_CODE_FILE
from hf_dpmerge.privacy.record import PRIVACY_RECORD_NAME, PrivacyRecord
from hf_dpmerge.privacy.statement import privacy_statement, public_eval_note, seeded_warning

RELEASE_FILES = (PRIVACY_RECORD_NAME, "adapter_config.json", "adapter_model.safetensors")

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
    PRIVACY_RECORD_NAME, "README.md", "dp_noise_stats.safetensors",
    # the remote code of the mean-pooling head (hf_dpmerge.modeling.stock_release)
    REMOTE_CODE_FILE,
    # task models for stock loaders, one folder level down: an adapter's base/, a merged release's <task>/
    *(f"*/{name}" for name in (
        "model.safetensors", "config.json", REMOTE_CODE_FILE, "tokenizer.json", "tokenizer_config.json",
        "special_tokens_map.json", "vocab.txt", PRIVACY_RECORD_NAME,
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


def adapter_card(record: PrivacyRecord, name: str) -> str:
    """The README.md of an adapter pushed by ``DPSAMTrainer.push_to_hub``: its privacy statement and nothing
    computed on private data (no losses, no metrics; Trainer's generated card would list them)."""
    notes = "".join(f"\n{note}" for note in (seeded_warning({name: record}), public_eval_note({name: record})) if note)
    return (
        f"---\nlibrary_name: peft\ntags: [hf_dpmerge, differential-privacy, lora]\n---\n\n# {name}\n\n"
        f"A LoRA adapter trained with `hf_dpmerge`'s `DPSAMTrainer`; its privacy record is `{PRIVACY_RECORD_NAME}`.\n\n"
        f"## Privacy\n\n{privacy_statement({name: record})}{notes}\n"
        "Training losses, evaluation metrics and other statistics computed on the private training data are not "
        "covered by the guarantee and are not published here.\n"
    )
