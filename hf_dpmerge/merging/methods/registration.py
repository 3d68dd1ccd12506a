"""Plugging hf_dpmerge into mergekit: method registration, and the checks of a configuration that uses our methods.

mergekit 0.1.5 has no plugin entry points, so the start-up hook (``_hf_dpmerge_mergekit``, installed as a
``.pth``/``.start`` pair) calls :func:`on_merge_methods_import` right after ``mergekit.merge_methods`` is
imported. That only registers our methods (:data:`~.mergekit_methods.METHODS`, ``safe_merge``): stock mergekit
(``mergekit-yaml``, ``run_merge``, ``merge_state_dicts``) behaves exactly as without hf_dpmerge for its own methods.

:func:`check_config` is what ``hf-dpmerge merge`` (:func:`hf_dpmerge.merging.run.merge`) checks before writing
anything: an unknown method name; for every method, each input's privacy record against the merge base (its
recorded base fingerprint); for the methods of :data:`~.mergekit_methods.METHODS` also unknown parameter keys, a missing
scale and every input; for ``safe_merge``, its keys and unwanted inputs. Under plain ``mergekit-yaml`` our methods
check each input when they merge its first tensor (mergekit's own output handling applies); mergekit's own methods
check no base there.
"""

from __future__ import annotations

import difflib
import importlib
import types
from typing import Any


def register_methods() -> None:
    """Register our methods (:data:`~.mergekit_methods.METHODS`, ``safe_merge``) with mergekit: importing their
    modules does it.

    When that module is itself being imported (it imports ``mergekit.merge_methods``, which fires the
    hook), ``import_module`` returns it half-initialised and its last lines register the methods.
    """
    importlib.import_module("hf_dpmerge.merging.methods.mergekit_methods")
    importlib.import_module("hf_dpmerge.merging.methods.safe_merge")


def check_method_name(name: str) -> None:
    """Refuse a ``merge_method`` mergekit does not know (it would fail only after loading every input)."""
    from mergekit.merge_methods import registered_methods

    known = sorted(method.spec.name for method in registered_methods())
    if name not in known:
        close = difflib.get_close_matches(name, known, 1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown merge_method {name!r}{hint}; known methods: {known}")


def check_parameter_values(merge_config: Any) -> None:
    """Refuse a plain parameter value the method cannot take (``lambda: abc``), naming the key and where it is set;
    mergekit would report only "1 validation error for float", after loading the inputs. Gradients (lists) and
    conditional values are left to mergekit."""
    from mergekit.merge_methods import get
    from pydantic import ValidationError

    specs = {p.name: p for p in get(merge_config.merge_method).spec.parameters}
    places = [("parameters", merge_config.parameters or {})]
    places += [(f"models[{i}].parameters", m.parameters or {}) for i, m in enumerate(merge_config.models or [])]
    for where, settings in places:
        for key, value in settings.items():
            if key not in specs or not isinstance(value, str | int | float | bool):
                continue
            try:
                specs[key].validate(value)
            except ValidationError as err:
                problem = err.errors()[0]["msg"]
                raise ValueError(f"{merge_config.merge_method}: {where}.{key} = {value!r}: {problem}") from None


def check_config(merge_config: Any, lora_merge_cache: str | None) -> None:
    """Reject an unknown method and, whatever the method, an input whose privacy record names another base; for our
    methods, also unknown YAML keys and bad inputs, before any output exists."""
    from hf_dpmerge.merging.inputs import input_settings, require_private
    from hf_dpmerge.merging.methods.mergekit_methods import ALLOW_NON_PRIVATE, METHODS
    from hf_dpmerge.merging.methods.safe_merge import check_safe_merge_config, safe_merge
    from hf_dpmerge.merging.validation import (
        check_inputs,
        check_local_paths,
        check_parameter_keys,
        check_recorded_bases,
    )

    check_method_name(merge_config.merge_method)
    check_local_paths(merge_config)
    check_parameter_values(merge_config)
    method = next((m for m in METHODS if m.spec.name == merge_config.merge_method), None)
    if method is None:  # mergekit's own methods and safe_merge: every recorded base, mergekit checks the rest
        if merge_config.merge_method == safe_merge.spec.name:
            check_safe_merge_config(merge_config)
        check_recorded_bases(merge_config)
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


def on_merge_methods_import(_module: types.ModuleType) -> None:
    """The start-up hook's only action: register our methods (nothing of mergekit's own is changed)."""
    register_methods()
