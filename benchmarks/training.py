"""One training unit in this process, by ``train_glue.py``'s own code from one base shared under the work folder:
trained, scored on the validation split (the adapter loaded as a user loads it) and the whole test split."""

from __future__ import annotations

import dataclasses
import gc
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hf_dpmerge.scripts import train as train_script

NON_PRIVATE_FLAGS = ("--dp", "false", "--sam_mode", "none", "--align_lambda", "0")


def validation_metrics(task: str, runs_dir: Path, base_dir: Path) -> dict[str, float]:
    """The metrics of ``runs_dir/<task>/adapter`` (loaded as a user loads it) on the task's validation split."""
    from hf_dpmerge.analysis.evaluation import predict_logits
    from hf_dpmerge.analysis.task_models import load_individual_model
    from hf_dpmerge.data import compute_metrics, load_task, predictions_from_logits, tokenize_task
    from hf_dpmerge.records.record import PrivacyRecord

    record = PrivacyRecord.load(runs_dir / task / "adapter")
    splits, spec = load_task(task)
    tokenizer = train_script.AutoTokenizer.from_pretrained(base_dir)
    data = tokenize_task(splits["validation"], spec, tokenizer, max_length=int(record.extra["max_length"]))
    model = load_individual_model(base_dir, runs_dir / task / "adapter", spec)
    logits = predict_logits(model, data, tokenizer, batch_size=128)
    return compute_metrics(spec, predictions_from_logits(spec, logits), data["labels"])


def train_in_process(task: str, argv: list[str], seed: int, work_dir: Path) -> tuple[dict[str, Any], float, Path]:
    """Train ``task`` with train_glue.py's ``argv`` in this process, from one base shared under ``work_dir``:
    (the script's summary, training seconds, the base directory)."""
    from transformers import set_seed

    run = train_script.plan_runs(argv)[task]
    base_dir = train_script.shared_base(dataclasses.replace(run.script, runs_dir=str(work_dir)))
    set_seed(seed)
    start = time.perf_counter()
    summary = train_script.train_task(task, *run, base_dir)
    return summary, time.perf_counter() - start, base_dir


def train_unit(task: str, flags: Sequence[str], seed: int, work_dir: Path, name: str,
               keep: bool = False) -> dict[str, Any]:
    """Train ``task`` with train_glue.py's ``flags`` in ``work_dir/<name>`` (deleted afterwards; with ``keep`` its
    released folders move to ``work_dir/kept/<name>/<task>/`` first), the frozen prefixes cached under
    ``work_dir/prefix_cache``; scored on the validation and the whole test split."""
    runs_dir = work_dir / name
    argv = [*flags, "--task", task, "--seed", str(seed), "--runs_dir", str(runs_dir),
            "--prefix_cache_dir", str(work_dir / "prefix_cache"), "--overwrite", "true", "--disable_tqdm", "true"]
    summary, seconds, base_dir = train_in_process(task, argv, seed, work_dir)
    result = {"test": summary["test"], "validation": validation_metrics(task, runs_dir, base_dir),
              "train_seconds": seconds, "steps": summary["steps"], "epsilon": summary["epsilon"]}
    if keep:
        kept = work_dir / "kept" / name / task
        shutil.rmtree(kept, ignore_errors=True)
        kept.mkdir(parents=True)
        for released in ("adapter", "encoder_adapter", "eval_metrics.json"):
            shutil.move(runs_dir / task / released, kept / released)
    shutil.rmtree(runs_dir, ignore_errors=True)
    gc.collect()
    return result
