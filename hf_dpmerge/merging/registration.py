"""Plugging hf_dpmerge into mergekit: method registration, and the guarded ``run_merge`` of ``hf-dpmerge merge``.

mergekit 0.1.5 has no plugin entry points, so the start-up hook (``_hf_dpmerge_mergekit``, installed as a
``.pth``/``.start`` pair) calls :func:`on_merge_methods_import` right after ``mergekit.merge_methods`` is
imported. That only registers ``cauchy_poe`` and ``dp_aware``: stock mergekit (``mergekit-yaml``,
``run_merge``, ``merge_state_dicts``) behaves exactly as without hf_dpmerge for its own methods.

The output-directory policy lives in hf_dpmerge's own command: ``hf-dpmerge merge`` calls :func:`activate`,
which wraps ``run_merge`` in that process only (:func:`guard_run_merge`). There, for any method: an unknown
method name is refused up front, a non-empty output directory is refused unless overwriting a previous merge
was asked for (:mod:`.output_dir`), the merge is written into a scratch directory and renamed into place at
the end (a failed or killed merge leaves no output), stale ``--lora-merge-cache`` entries are dropped,
when inputs carry privacy records the model card gets a privacy section, and ``finish(staged, config)``
adds what the caller writes into the output before it appears (hf-dpmerge merge: each task's folder for
stock loaders, :mod:`hf_dpmerge.scripts.task_folders`). For ``cauchy_poe`` and
``dp_aware`` every input is also checked before anything is written; for ``safe_merge``, its keys and
unwanted inputs. Under plain ``mergekit-yaml`` our
methods check each input when they merge its first tensor (mergekit's own output handling applies).
"""

from __future__ import annotations

import difflib
import functools
import importlib
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

_WRAPPED = "__hf_dpmerge_guarded__"


def register_methods() -> None:
    """Register ``cauchy_poe``, ``dp_aware`` and ``safe_merge`` with mergekit: importing their modules does it.

    When that module is itself being imported (it imports ``mergekit.merge_methods``, which fires the
    hook), ``import_module`` returns it half-initialised and its last lines register the methods.
    """
    importlib.import_module("hf_dpmerge.merging.methods")
    importlib.import_module("hf_dpmerge.merging.safe_merge")


def check_method_name(name: str) -> None:
    """Refuse a ``merge_method`` mergekit does not know (it would fail only after loading every input)."""
    from mergekit.merge_methods import registered_methods

    known = sorted(method.spec.name for method in registered_methods())
    if name not in known:
        close = difflib.get_close_matches(name, known, 1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown merge_method {name!r}{hint}; known methods: {known}")


def check_config(merge_config: Any, lora_merge_cache: str | None) -> None:
    """Reject an unknown method; for our methods, also unknown YAML keys and bad inputs, before any output exists."""
    from hf_dpmerge.merging.inputs import input_settings, require_private
    from hf_dpmerge.merging.methods import ALLOW_NON_PRIVATE, METHODS
    from hf_dpmerge.merging.safe_merge import check_safe_merge_config, safe_merge
    from hf_dpmerge.merging.validation import check_inputs, check_parameter_keys

    check_method_name(merge_config.merge_method)
    if merge_config.merge_method == safe_merge.spec.name:
        check_safe_merge_config(merge_config)
        return
    method = next((m for m in METHODS if m.spec.name == merge_config.merge_method), None)
    if method is None:
        return
    check_parameter_keys(
        merge_config,
        {p.name for p in method.spec.shared_parameters},
        {p.name for p in method.spec.input_parameters},
    )
    shared = merge_config.parameters or {}
    if missing := sorted(p.name for p in method.spec.shared_parameters if p.required and p.name not in shared):
        raise ValueError(f"{method.spec.name} needs {', '.join(missing)} under the top-level `parameters:` (none "
                         "has a default); add e.g. `parameters: {lambda: 0.5}`")
    method.check_settings(shared)
    if any(p.name == ALLOW_NON_PRIVATE for p in method.spec.shared_parameters):
        for reference, _, base in input_settings(merge_config):
            if reference != base:
                require_private(method.spec.name, reference, bool(shared.get(ALLOW_NON_PRIVATE, False)))
    check_inputs(merge_config, lambda per_model: method.needs_noise(shared, per_model), lora_merge_cache)


def guard_run_merge(
    run_merge: Callable[..., Any], finish: Callable[[Path, Any], Any] | None = None
) -> Callable[..., Any]:
    """``run_merge`` with the output-directory policy, the checks above, atomic output, the privacy card and
    ``finish(staged_output, merge_config)`` before the output is renamed into place."""
    if getattr(run_merge, _WRAPPED, False):
        return run_merge

    @functools.wraps(run_merge)
    def guarded(merge_config: Any, out_path: str, *args: Any, **kwargs: Any) -> Any:
        from hf_dpmerge.merging.lora_cache import drop_stale_lora_merges
        from hf_dpmerge.merging.output_dir import check_merge_output, overwrite_requested
        from hf_dpmerge.merging.privacy_section import write_privacy_section
        from hf_dpmerge.utils.io import staged_directory

        options = kwargs["options"] if "options" in kwargs else args[0]
        check_merge_output(out_path, overwrite_requested())
        check_config(merge_config, options.lora_merge_cache)
        if options.lora_merge_cache:
            drop_stale_lora_merges(merge_config, options.lora_merge_cache)
        with staged_directory(out_path) as staged:  # same basename: mergekit titles the model card after it
            result = run_merge(merge_config, str(staged), *args, **kwargs)
            if not staged.is_dir():
                raise RuntimeError(f"mergekit reported success but wrote no output for {out_path}")
            if options.write_model_card:
                write_privacy_section(str(staged), merge_config)
            if finish is not None:
                finish(staged, merge_config)
        return result

    setattr(guarded, _WRAPPED, True)
    return guarded


def on_merge_methods_import(_module: types.ModuleType) -> None:
    """The start-up hook's only action: register our methods (nothing of mergekit's own is changed)."""
    register_methods()


def activate(finish: Callable[[Path, Any], Any] | None = None) -> None:
    """``hf-dpmerge merge``'s set-up, in its own process: our methods registered, ``mergekit-yaml``'s
    ``run_merge`` guarded with ``finish`` (idempotent)."""
    import mergekit.scripts.run_yaml as run_yaml

    register_methods()
    run_yaml.run_merge = guard_run_merge(run_yaml.run_merge, finish)

