"""Plugging hf_dpmerge into mergekit: method registration and a guarded ``run_merge``.

mergekit 0.1.5 has no plugin entry points, so the start-up hook (``_hf_dpmerge_mergekit``, installed as a
``.pth``/``.start`` pair) calls :func:`on_merge_methods_import` right after ``mergekit.merge_methods`` is
imported and :func:`on_merge_import` right after ``mergekit.merge``. The second wraps
``mergekit.merge.run_merge`` (which ``mergekit-yaml`` imports from there): for ``cauchy_poe`` and ``dp_aware``
every input is checked before anything is written and a failed merge leaves no partial output directory;
for any method, stale ``--lora-merge-cache`` entries are dropped, and when inputs carry privacy records the
model card gets a privacy section.
"""

from __future__ import annotations

import functools
import importlib
import shutil
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

_WRAPPED = "__hf_dpmerge_guarded__"


def register_methods() -> None:
    """Register ``cauchy_poe`` and ``dp_aware`` with mergekit: importing their module does it.

    When that module is itself being imported (it imports ``mergekit.merge_methods``, which fires the
    hook), ``import_module`` returns it half-initialised and its last lines register the methods.
    """
    importlib.import_module("hf_dpmerge.merging.methods")


def check_config(merge_config: Any, lora_merge_cache: str | None) -> None:
    """For our methods: reject unknown YAML keys and bad inputs before any output exists."""
    from hf_dpmerge.merging.merge_inputs import check_inputs, check_parameter_keys
    from hf_dpmerge.merging.methods import METHODS

    method = next((m for m in METHODS if m.spec.name == merge_config.merge_method), None)
    if method is None:
        return
    check_parameter_keys(
        merge_config,
        {p.name for p in method.spec.shared_parameters},
        {p.name for p in method.spec.input_parameters},
    )
    shared = merge_config.parameters or {}
    check_inputs(merge_config, lambda per_model: method.needs_noise(shared, per_model), lora_merge_cache)


def _clear(out_path: Path, existed: bool) -> None:
    if not existed:
        shutil.rmtree(out_path, ignore_errors=True)
        return
    for child in out_path.iterdir():
        shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()


def guard_run_merge(run_merge: Callable[..., Any]) -> Callable[..., Any]:
    """``run_merge`` with the checks above, clean-up of a failed merge's output, and the privacy card."""
    if getattr(run_merge, _WRAPPED, False):
        return run_merge

    @functools.wraps(run_merge)
    def guarded(merge_config: Any, out_path: str, *args: Any, **kwargs: Any) -> Any:
        from hf_dpmerge.merging.merge_inputs import drop_stale_lora_merges
        from hf_dpmerge.merging.methods import METHODS
        from hf_dpmerge.merging.model_card import append_privacy_section

        options = kwargs["options"] if "options" in kwargs else args[0]
        ours = merge_config.merge_method in {m.spec.name for m in METHODS}
        target = Path(out_path)
        existed = target.exists()
        was_empty = not existed or (target.is_dir() and not any(target.iterdir()))
        check_config(merge_config, options.lora_merge_cache)
        if options.lora_merge_cache:
            drop_stale_lora_merges(merge_config, options.lora_merge_cache)
        try:
            result = run_merge(merge_config, out_path, *args, **kwargs)
        except BaseException:
            if ours and was_empty:
                _clear(target, existed)
            raise
        if options.write_model_card:
            append_privacy_section(out_path, merge_config)
        return result

    setattr(guarded, _WRAPPED, True)
    return guarded


def on_merge_methods_import(_module: types.ModuleType) -> None:
    register_methods()


def on_merge_import(module: types.ModuleType) -> None:
    module.run_merge = guard_run_merge(module.run_merge)


def activate() -> None:
    """Do in-process what the start-up hook does, for callers that may run without it (idempotent)."""
    import mergekit.merge
    import mergekit.scripts.run_yaml as run_yaml

    register_methods()
    on_merge_import(mergekit.merge)
    run_yaml.run_merge = guard_run_merge(run_yaml.run_merge)

