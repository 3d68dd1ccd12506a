"""How one task's run in the runs layout (:mod:`hf_dpmerge.records.run_folders`) is resolved for evaluation:
its record, dataset, split seed and length, and the runs a merged model merged.

A run folder's dataset is the own dataset its ``dataset.json`` names (:class:`~hf_dpmerge.data.dataset_source.
DatasetSource`), else the task named in its privacy record (the folder name when it has none). The split seed and
``max_length`` come from the caller, else the record's ``extra`` (``data_seed``, ``max_length``), else the
defaults, so evaluation sees the splits training saw.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hf_dpmerge.data.dataset_source import DatasetSource
from hf_dpmerge.data.tasks import GLUE_TASKS, TaskSpec, get_task_spec
from hf_dpmerge.records.merge_base import merged_config
from hf_dpmerge.records.record import CAUSAL_LM, PrivacyRecord
from hf_dpmerge.records.run_folders import ADAPTER_DIR, MERGE_CONFIG_NAME, is_peft_adapter, run_adapters

DEFAULT_MAX_LENGTH = 128
SPLITS = ("train", "validation", "test")


@dataclass
class TaskRun:
    """One ``<runs>/<name>/adapter`` with its record, the dataset it was trained on and its data settings."""

    name: str
    adapter_dir: Path
    record: PrivacyRecord
    spec: TaskSpec
    data_seed: int
    max_length: int
    source: DatasetSource | None = None

    @property
    def task(self) -> str:
        return self.spec.name

    @property
    def is_causal_lm(self) -> bool:
        """Whether the adapter is a causal-LM adapter (``examples/train_causal_lm.py``), scored by its verbalisers."""
        return self.record.extra.get("model_kind") == CAUSAL_LM


def discover_tasks(runs_dir: str | os.PathLike) -> list[str]:
    """The names of the runs under ``runs_dir`` (:func:`~hf_dpmerge.records.run_folders.run_adapters`), sorted."""
    return list(run_adapters(runs_dir))


def merged_tasks(runs_dir: str | os.PathLike, merged_dir: str | os.PathLike) -> list[str] | None:
    """The run folders whose adapter or model the merged model's ``mergekit_config.yml`` names, in its order
    (None when the merged model has no such file). A path names run folder ``t`` when one of its parts is
    ``t`` and ``<runs>/t/adapter/`` is a run's adapter (``runs/t/encoder_adapter`` → ``t``)."""
    config_path = Path(merged_dir) / MERGE_CONFIG_NAME
    if not config_path.is_file():
        return None
    data = merged_config(merged_dir) or {}
    sources = list(data.get("models") or [])
    sources += [source for part in data.get("slices") or [] for source in part.get("sources") or []]
    known = set(discover_tasks(runs_dir))
    names: list[str] = []
    for source in sources:
        model = source.get("model") if isinstance(source, dict) else None
        for part in Path(str(model)).parts if model else ():
            if part in known and part not in names:
                names.append(part)
    if not names:
        raise ValueError(f"{config_path} merges none of the run folders under {runs_dir} ({sorted(known)}): "
                         "pass --runs or --tasks")
    return names


def check_model_dirs(base_dir: Path, merged_dir: Path | None) -> None:
    """Refuse a base or merged directory without ``config.json``, saying which step produces it."""
    for what, directory in (("base model", base_dir), ("merged model", merged_dir)):
        if directory is not None and not (directory / "config.json").is_file():
            hint = "run mergekit-yaml first" if what == "merged model" else "train adapters first"
            raise FileNotFoundError(f"{what} directory {directory} has no config.json ({hint})")


def task_runs(
    runs_dir: str | os.PathLike,
    names: Sequence[str] | None = None,
    *,
    data_seed: int | None = None,
    max_length: int | None = None,
    merged_dir: str | os.PathLike | None = None,
) -> list[TaskRun]:
    """The runs named ``names``; by default the runs ``merged_dir`` merged (:func:`merged_tasks`), else every
    run of ``runs_dir``."""
    from hf_dpmerge.data.load import DEFAULT_SPLIT_SEED

    runs_dir = Path(runs_dir)
    if not names and merged_dir is not None:
        names = merged_tasks(runs_dir, merged_dir)
    names = list(names) if names else discover_tasks(runs_dir)
    if not names:
        raise FileNotFoundError(f"no <task>/{ADAPTER_DIR}/ adapters under {runs_dir}")
    runs = []
    for name in names:
        adapter_dir = runs_dir / name / ADAPTER_DIR
        if not (runs_dir / name).is_dir():
            found = discover_tasks(runs_dir) if runs_dir.is_dir() else []
            close = difflib.get_close_matches(name, found, 1)
            raise FileNotFoundError(f"--tasks {name}: no folder {runs_dir / name}" + (
                f" (did you mean {close[0]!r}?)" if close else "") + f"; task runs under {runs_dir}: {found or 'none'}")
        if not is_peft_adapter(adapter_dir):
            raise FileNotFoundError(f"{adapter_dir} is not a peft adapter (no adapter_config.json)")
        record = PrivacyRecord.load(adapter_dir)
        source = DatasetSource.load(runs_dir / name)
        runs.append(TaskRun(
            name=name, adapter_dir=adapter_dir, record=record,
            spec=own_spec(name, record, source) if source else get_task_spec(record.task or name),
            data_seed=data_seed if data_seed is not None else int(record.extra.get("data_seed", DEFAULT_SPLIT_SEED)),
            max_length=max_length or int(record.extra.get("max_length", DEFAULT_MAX_LENGTH)), source=source,
        ))
    return runs


def own_spec(name: str, record: PrivacyRecord, source: DatasetSource) -> TaskSpec:
    """An own-data run's spec as training recorded it (its label names: those its head predicts; a causal LM's
    verbalisers: the answers it was trained to give; prompt → completion data: no labels)."""
    from hf_dpmerge.data.tasks import OWN, TOKEN_ACCURACY

    carved = tuple(record.extra.get("carved_splits") or ())
    if source.is_generative:
        return TaskSpec(record.task or name, 0, (), ("prompt",), TOKEN_ACCURACY, OWN, dataset=source,
                        carved_splits=carved)
    names = tuple(record.extra.get("label_names") or ())
    verbalisers = record.extra.get("verbalisers")
    return TaskSpec(record.task or name, len(names), names, source.text_columns, "accuracy", OWN, dataset=source,
                    label_origin=record.extra.get("label_names_from"),
                    carved_splits=carved, verbalisers=tuple(verbalisers) if verbalisers else None)


def task_rows(run: TaskRun, split: str, *, max_samples: int | None = None, glue_path: str | None = None):
    """``split`` of the run's task as loaded (untokenized, with its ``label`` column), from the split seed training
    used; ``max_samples`` takes a seeded stratified subset."""
    from hf_dpmerge.data.load import load_task

    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    caps = {"max_train_samples": max_samples} if split == "train" else {"max_eval_samples": max_samples}
    if run.source is not None:
        splits, spec = load_task(run.task, seed=run.data_seed, source=run.source, **caps)
        if spec.label_names != run.spec.label_names:
            raise ValueError(f"{run.name}: the data now gives labels {list(spec.label_names)}, but the adapter's head "
                             f"predicts {list(run.spec.label_names)}; evaluate on the data it was trained on")
        return splits[split]
    splits, _ = load_task(run.task, seed=run.data_seed, path=glue_path if run.task in GLUE_TASKS else None, **caps)
    return splits[split]


def load_split(run: TaskRun, split: str, tokenizer, *, max_samples: int | None = None,
               glue_path: str | None = None, keep_columns: tuple[str, ...] = ()):
    """:func:`task_rows` tokenized as in training; ``keep_columns`` survive tokenization
    (:class:`~hf_dpmerge.data.tokenize.MissingColumnError` if absent)."""
    from hf_dpmerge.data.tokenize import tokenize_task

    rows = task_rows(run, split, max_samples=max_samples, glue_path=glue_path)
    return tokenize_task(rows, run.spec, tokenizer, run.max_length, keep_columns=keep_columns)


def find_tokenizer(candidates: Sequence[Path]):
    """The tokenizer saved in the first of ``candidates`` that has one. A release folder's remote code is its
    model's (``modeling_mean_pooling_bert.py``), never its tokenizer's: it is not run, and no prompt asks."""
    from transformers import AutoTokenizer

    for directory in candidates:
        if (directory / "tokenizer_config.json").is_file() or (directory / "tokenizer.json").is_file():
            return AutoTokenizer.from_pretrained(directory, trust_remote_code=False)
    raise FileNotFoundError(f"no tokenizer in {', '.join(map(str, candidates))}; pass a tokenizer")
