"""The merge YAML read by ``hf-dpmerge merge --as-adapter``: which of its settings a factor-space merge honours.

Per method, every parameter of the YAML is

- honoured (:data:`HONOURED`): the factor-space merge (:mod:`.factor_space`) computes with it exactly what the
  dense merge computes;
- accepted when it equals its default in the method's mergekit parameter spec: it changes nothing;
- otherwise refused, naming the parameter and its value: it acts on dense coordinates, so only the dense merge
  (``hf-dpmerge merge`` without ``--as-adapter``) can run it.

Top-level per-model parameters (a global ``weight``) apply to every input, as in mergekit; per-input values
override them; values that vary across layers (lists, filters) are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hf_dpmerge.merging.adapters.factor_space import FACTOR_METHODS, SPECTRAL_METHODS
from hf_dpmerge.merging.inputs import RECORD_OVERRIDES

DENSE = "use the dense merge (hf-dpmerge merge without --as-adapter)"
HONOURED: dict[str, frozenset[str]] = {
    # int8_mask, rescale, density: no-ops of mergekit's task_arithmetic (no consensus, no sparsification)
    "task_arithmetic": frozenset({"lambda", "weight", "normalize", "int8_mask", "rescale", "density"}),
    "dp_aware": frozenset({"lambda", "weight", "shrinkage", "allow_non_private", *RECORD_OVERRIDES}),
    "cauchy_poe": frozenset({"lambda", "tol", "jitter", "max_iter", "conv_tol", "dp_calibrated", "layers",
                             *RECORD_OVERRIDES}),
    "safe_merge": frozenset({"scale", "weight", "unwanted", "projection", "percentile"}),  # percentile: see below
    "tsv": frozenset({"lambda", "k", "noise_floor", *RECORD_OVERRIDES}),
    "iso_c": frozenset({"lambda", "noise_floor", *RECORD_OVERRIDES}),
    "iso_cts": frozenset({"lambda", "common_space_fraction", "noise_floor", *RECORD_OVERRIDES}),
    "wudi": frozenset({"lambda", "steps", "lr", "solver", "noise_floor", *RECORD_OVERRIDES}),  # solver: see below
}
EXACT_PERCENTILE = 100.0  # safe_merge without a projection: the mask keeps every entry (plain task arithmetic)


def _specs(method: str) -> dict[str, Any]:
    from mergekit.merge_methods import registered_methods

    import hf_dpmerge.merging.methods.mergekit_methods  # noqa: F401  (registers cauchy_poe, dp_aware and the spectral methods)
    import hf_dpmerge.merging.methods.safe_merge  # noqa: F401  (registers safe_merge)

    spec = next(m.spec for m in registered_methods() if m.spec.name == method)
    return {parameter.name: parameter for parameter in spec.parameters}


def _validated(method: str, spec: Any, value: Any, where: str) -> Any:
    """``value`` checked against its spec (a scalar), and refused unless honoured or the spec's default."""
    from mergekit.merge_methods.base import MISSING

    if isinstance(value, list | dict):
        raise ValueError(f"--as-adapter: {where}{spec.name}={value!r} varies across layers; {DENSE}")
    try:
        value = spec.validate(value)
    except ValueError as err:
        raise ValueError(f"--as-adapter: {method} parameter {where}{spec.name}={value!r}: {err}") from None
    if spec.name not in HONOURED[method] and (spec.default is MISSING or value != spec.default):
        raise ValueError(
            f"--as-adapter: {method} parameter {where}{spec.name}={value!r} acts on dense coordinates, so a merged "
            f"adapter cannot equal the dense merge; {DENSE}"
            + ("" if spec.default is MISSING else f", or set it to its default {spec.default!r}")
        )
    return value


def adapter_merge_arguments(config: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of :func:`~.adapter_merge.merge_shared_a_adapters` (``adapter_dirs``
    included, ``out_dir`` and ``overwrite`` not) for a merge YAML mapping; refuses what it cannot honour."""
    from mergekit.common import ModelReference
    from mergekit.merge_methods.base import MISSING, ParameterScope

    method = config.get("merge_method")
    if method not in FACTOR_METHODS:
        raise ValueError(f"--as-adapter merges with {list(FACTOR_METHODS)}; merge_method {method!r} is not exact "
                         f"in factor space (it works on dense coordinates): {DENSE}")
    specs = _specs(method)
    given = dict(config.get("parameters") or {})
    if unknown := sorted(set(given) - set(specs)):
        raise ValueError(f"--as-adapter: unknown {method} parameter {unknown}; it takes {sorted(specs)}")
    shared = {name: _validated(method, specs[name], value, "") for name, value in given.items()}
    per_input = {name: spec for name, spec in specs.items() if spec.scope != ParameterScope.SHARED}
    adapters, settings = [], []
    for entry in config["models"]:
        reference = ModelReference.parse(entry["model"] if isinstance(entry, dict) else entry)
        if reference.lora is None:
            raise ValueError(f"--as-adapter: input {reference} is not base+adapter; give each input as BASE+ADAPTER")
        own = dict((entry.get("parameters") or {}) if isinstance(entry, dict) else {})
        if unknown := sorted(set(own) - set(per_input)):
            raise ValueError(f"--as-adapter: input {reference} has unknown per-model parameter {unknown}")
        values = {name: shared[name] for name in per_input if name in shared}
        values.update({name: _validated(method, per_input[name], value, f"{reference}: ")
                       for name, value in own.items()})
        adapters.append(reference.lora.path)
        settings.append(values)

    def setting(name: str) -> Any:
        value = shared.get(name, specs[name].default)
        if value is MISSING:
            raise ValueError(f"--as-adapter needs `parameters: {{{name}: …}}` (the merged task vector's scale has "
                             "no default)")
        return value

    weights = [float(values.pop("weight", 1.0)) for values in settings]
    if method == "task_arithmetic" and setting("normalize") and abs(sum(weights)) >= 1e-8:
        weights = [weight / sum(weights) for weight in weights]  # mergekit's normalize: Σ w_i τ_i / Σ w_i
    unwanted = [bool(values.pop("unwanted", False)) for values in settings]
    arguments: dict[str, Any] = {
        "adapter_dirs": adapters, "method": method, "weights": weights, "unwanted": unwanted,
        "overrides": [{k: v for k, v in values.items() if k in RECORD_OVERRIDES and v is not None}
                      for values in settings],
        "base_model": None if config.get("base_model") is None else str(config["base_model"]),
    }
    if method == "safe_merge":
        projection = setting("projection")
        if projection != "none" and "percentile" in shared:
            raise ValueError(f"--as-adapter: safe_merge 'percentile' sets the entry mask, which 'projection: "
                             f"{projection}' replaces; remove one of them")
        if projection == "none" and float(setting("percentile")) != EXACT_PERCENTILE:
            raise ValueError(
                f"--as-adapter: safe_merge parameter percentile={setting('percentile')!r} masks dense coordinates, "
                f"so a merged adapter cannot equal the dense merge; {DENSE}, or use 'projection: away' (exact in "
                f"factor space) or percentile: {EXACT_PERCENTILE:g}"
            )
        return arguments | {"lam": float(setting("scale")), "projection": projection}
    arguments["lam"] = float(setting("lambda"))
    if method == "dp_aware":
        arguments |= {"shrinkage": setting("shrinkage"), "allow_non_private": bool(setting("allow_non_private"))}
    if method == "wudi" and setting("solver") != "least_squares":
        raise ValueError(f"--as-adapter: wudi parameter solver={setting('solver')!r} takes Adam steps on every "
                         "coordinate of the dense ΔW, which leave the shared A's row space, so a merged adapter cannot "
                         f"equal the dense merge; {DENSE}, or use 'solver: least_squares' (exact in factor space)")
    if method in ("cauchy_poe", *SPECTRAL_METHODS):
        arguments["options"] = {name: setting(name) for name, spec in specs.items()
                                if spec.scope == ParameterScope.SHARED and name != "lambda"}
    return arguments
