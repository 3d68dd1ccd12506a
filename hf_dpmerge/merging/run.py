"""The one way hf_dpmerge runs a mergekit merge: :func:`merge`, used by ``hf-dpmerge merge``, ``hf-dpmerge tune`` and
the benchmarks (plain ``mergekit-yaml`` only gets our methods registered by the start-up hook: nothing of
mergekit is patched).

Before anything is written: unknown YAML keys and methods are refused, an existing output only with
``overwrite`` and when it holds a previous merge (:func:`check_merge_output`), every input's privacy record must name
the merge base whatever the method, and for our methods every input and setting is checked
(:func:`.methods.registration.check_config`). The merge is written into a scratch directory renamed into place at
the end, so a failed merge leaves nothing at the output; before that the card gets its privacy section and
``finish(staged, config)`` adds the caller's files (docs/design.md §8).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml
from mergekit.config import MergeConfiguration
from mergekit.io.tasks import LoaderCache
from mergekit.merge import run_merge
from mergekit.options import MergeOptions

from hf_dpmerge.merging.config_edit import load_config_mapping, unknown_config_keys
from hf_dpmerge.merging.lora_cache import drop_stale_lora_merges
from hf_dpmerge.merging.methods.registration import check_config, register_methods
from hf_dpmerge.merging.privacy_section import write_privacy_section
from hf_dpmerge.records.run_folders import MERGE_CONFIG_NAME
from hf_dpmerge.utils.io import staged_directory
from hf_dpmerge.utils.own_output import check_own_output

Finish = Callable[[Path, MergeConfiguration], Any]
MERGE_MARKER = MERGE_CONFIG_NAME  # every merge output holds it (mergekit's copy of the config)


def check_merge_output(target: str | os.PathLike, overwrite: bool) -> None:
    """A merge's output path: missing, empty, or (``overwrite``) a previous merge
    (:mod:`hf_dpmerge.utils.own_output`)."""
    check_own_output(target, overwrite=overwrite, marker=MERGE_MARKER, output="merge", flag="merge output")


def parse_config(config: str | os.PathLike | Mapping[str, Any]) -> tuple[MergeConfiguration, str]:
    """``config`` (a YAML file, or a mapping) as mergekit's ``MergeConfiguration`` and its YAML source; unknown
    keys and configurations mergekit rejects are a ``ValueError`` naming the problem."""
    if isinstance(config, Mapping):
        data = dict(config)
        if unknown := list(unknown_config_keys(data)):
            raise ValueError(f"merge config: unknown key {'; '.join(unknown)}: fix the spelling")
        source = yaml.safe_dump(data, sort_keys=False)
    else:
        data = load_config_mapping(config)
        source = Path(config).read_text(encoding="utf-8")
    try:
        return MergeConfiguration.model_validate(data), source
    except Exception as err:  # pydantic's ValidationError, mergekit's RuntimeError from its own validators
        raise ValueError(f"mergekit rejects the merge config: {err}") from None


def merge(config: str | os.PathLike | Mapping[str, Any], out_path: str | os.PathLike, *,
          options: MergeOptions | None = None, overwrite: bool = False, finish: Finish | None = None) -> Path:
    """Merge ``config`` into ``out_path`` with mergekit's ``run_merge`` under the checks and atomic output of the
    module docstring; returns ``out_path``."""
    register_methods()
    options = options or MergeOptions()
    merge_config, source = parse_config(config)
    out_path = Path(out_path)
    check_merge_output(out_path, overwrite)
    check_config(merge_config, options.lora_merge_cache)
    if options.lora_merge_cache:
        drop_stale_lora_merges(merge_config, options.lora_merge_cache)
    # mergekit keeps its tensor loaders for the whole process, keyed by the path as written: a second merge from
    # another working directory or after an input was rewritten would read the first one's tensors
    _forget_loaded_inputs()
    with staged_directory(out_path) as staged:  # same basename: mergekit titles the model card after it
        run_merge(merge_config, str(staged), options=options, config_source=source)
        if not staged.is_dir():
            raise RuntimeError(f"mergekit reported success but wrote no output for {out_path}")
        if options.write_model_card:
            write_privacy_section(staged, merge_config)
        if finish is not None:
            finish(staged, merge_config)
    return out_path


def _forget_loaded_inputs() -> None:
    """Empty mergekit's per-process ``LoaderCache`` (its loaders are keyed by the input's path string only)."""
    cache = LoaderCache()
    cache.flush_all()
    cache.loaders.clear()
