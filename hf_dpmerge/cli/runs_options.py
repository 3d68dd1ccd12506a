"""Options shared by the verbs that read a runs layout and a merged model (``evaluate``, ``diagnose``, ``probe``), and
by the verbs that select a merge privately (``tune``, ``evolve``)."""

from __future__ import annotations

import argparse

from hf_dpmerge.data.tasks import parse_task_list


def add_runs_options(parser: argparse.ArgumentParser) -> None:
    """``--runs --merged --tasks --base --tokenizer --max_length --data_seed --batch_size --glue_path --device``."""
    parser.add_argument("--runs", default="runs", help="training output folder with base/ and <task>/adapter/ "
                        "(default: runs)")
    parser.add_argument("--merged", default="merged", help="merged model directory written by mergekit-yaml "
                        "(default: merged)")
    parser.add_argument("--tasks", help="comma-separated run folders (default: those the merged model's "
                        "mergekit_config.yml merged, else every <runs>/<task>/ with adapter/dp_privacy.json)")
    parser.add_argument("--base", help="base model directory (default: <runs>/base)")
    parser.add_argument("--tokenizer", help="tokenizer directory or Hub id (default: the adapter's, the "
                        "base's or the merged model's)")
    parser.add_argument("--max_length", type=int, help="truncate inputs to this many tokens (default: the "
                        "record's extra.max_length, else 128)")
    parser.add_argument("--data_seed", type=int, help="split seed (default: the record's extra.data_seed, "
                        "else 42); must match training's")
    parser.add_argument("--batch_size", type=int, default=32, help="batch size (default: 32)")
    parser.add_argument("--glue_path", help="GLUE dataset repository or local copy for GLUE tasks "
                        "(default: nyu-mll/glue)")
    parser.add_argument("--device", help="torch device (default: cuda when available, else cpu)")


def add_private_selection_options(parser: argparse.ArgumentParser) -> None:
    """``--mechanism --composition --validation_size --rows_per_unit --runs --tasks --base --lora-merge-cache
    --batch_size --device`` of ``tune`` and ``evolve`` (their docstrings explain the composition, the validation size
    and the rows per unit)."""
    from hf_dpmerge.records.selection_record import COMPOSITIONS
    from hf_dpmerge.training.dp.private_selection import DEFAULT_VALIDATION_SIZE, MECHANISMS

    parser.add_argument("--mechanism", choices=MECHANISMS, default="exponential",
                        help="exponential (report-noisy-max with Gumbel noise) or permute_and_flip")
    parser.add_argument("--composition", choices=COMPOSITIONS, default="sequential",
                        help="how ε_sel composes with the adapters' ε (default sequential; see above)")
    parser.add_argument("--validation_size", default=str(DEFAULT_VALIDATION_SIZE), metavar="N|TASK=N,...",
                        help="public number of validation examples scored per task (subsampled at random; "
                        f"default {DEFAULT_VALIDATION_SIZE}; see above)")
    parser.add_argument("--rows_per_unit", type=int, default=1, metavar="M",
                        help="public cap m on the validation rows scored per privacy unit of a user-level adapter's "
                        "task (Δ = m/(T·n); default 1; see above)")
    parser.add_argument("--runs", default="runs", help="training output folder with base/ and <task>/adapter/")
    parser.add_argument("--tasks", help="comma-separated run folders to score (default: every one)")
    parser.add_argument("--base", help="base model directory (default: <runs>/base)")
    parser.add_argument("--lora-merge-cache", dest="lora_merge_cache",
                        help="mergekit's LoRA merge cache (needed for base+adapter inputs)")
    parser.add_argument("--batch_size", type=int, default=32, help="evaluation batch size (default: 32)")
    parser.add_argument("--device", help="torch device (default: cuda when available, else cpu)")


def parse_tasks(text: str | None) -> list[str] | None:
    """``--tasks a,b`` as a list of distinct names (None: every run folder)."""
    return parse_task_list(text) if text else None


def check_positive(args: argparse.Namespace, *names: str) -> None:
    """Refuse a given option among ``names`` that is ≤ 0."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise ValueError(f"--{name} must be positive, got {value}")


def load_tokenizer(name: str | None):
    """The ``--tokenizer`` given, or None to let the runs layout supply one."""
    if not name:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)
