"""The stress grid's merges: each method's search space (the same budget for every method) and the mergekit
configuration of one point, generated per cell instead of read from ``merge_configs/*.yaml``.

Every space has :data:`BUDGET` points over the method's own knobs: the global scale λ (task arithmetic's Σ
scale; the normalised TIES family's mean scale), the kept fraction ``density`` of the sparsifying methods, the
Cauchy width floor ``tol``, dp_aware's ``consensus``. :mod:`.tuning` picks one point per method and cell on the
validation splits. Stock mergekit 0.1.5 task-vector methods that apply to LoRA task vectors with a shared base:
task_arithmetic, ties, dare_ties, dare_linear, della, della_linear, breadcrumbs, breadcrumbs_ties, sce (linear,
model_stock, karcher, slerp-family and passthrough average or interpolate whole models instead, and have no scale
to tune alike). Randomised methods (DARE, DELLA) draw their masks from mergekit's ``--random-seed`` (the cell's
seed).
"""

from __future__ import annotations

from itertools import product
from pathlib import Path
from typing import Any

BUDGET = 4


def _grid(**axes: tuple) -> tuple[dict[str, Any], ...]:
    return tuple(dict(zip(axes, values)) for values in product(*axes.values()))


# shared ("lambda", "consensus", "tol", "select_topk") and per-model ("density", "epsilon", "gamma") knobs
SPACES: dict[str, tuple[dict[str, Any], ...]] = {
    "task_arithmetic": _grid(**{"lambda": (0.25, 0.5, 0.75, 1.0)}),
    "ties": _grid(density=(0.2, 0.5), **{"lambda": (0.5, 1.0)}),
    "dare_ties": _grid(density=(0.2, 0.5), **{"lambda": (0.5, 1.0)}),
    "dare_linear": _grid(density=(0.2, 0.5), **{"lambda": (0.5, 1.0)}),
    "della": _grid(density=(0.3, 0.6), epsilon=(0.1,), **{"lambda": (0.5, 1.0)}),
    "della_linear": _grid(density=(0.3, 0.6), epsilon=(0.1,), **{"lambda": (0.5, 1.0)}),
    "breadcrumbs": _grid(density=(0.5, 0.8), gamma=(0.01,), **{"lambda": (0.5, 1.0)}),
    "breadcrumbs_ties": _grid(density=(0.5, 0.8), gamma=(0.01,), **{"lambda": (0.5, 1.0)}),
    "sce": _grid(select_topk=(0.1, 0.3, 0.6, 1.0)),
    "cauchy_poe": _grid(tol=(0.01, 0.1), **{"lambda": (0.5, 1.0)}),
    "dp_aware": _grid(consensus=("none", "precision_sign"), **{"lambda": (0.5, 1.0)}),
}
PER_MODEL = ("density", "epsilon", "gamma")
FIXED: dict[str, dict[str, Any]] = {  # set for every point, not tuned
    "cauchy_poe": {"dp_calibrated": True},  # each input's width from its noise (0 without DP noise)
}
NOT_PRIVATE_OPT_IN = ("dp_aware",)  # refuse inputs without a DP guarantee unless told (`allow_non_private`)

if any(len(points) != BUDGET for points in SPACES.values()):
    raise AssertionError(f"every method's space has {BUDGET} points")


def point_label(point: dict[str, Any]) -> str:
    """``density=0.2, lambda=1`` for the report."""
    return ", ".join(f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"
                     for key, value in point.items())


def merge_configuration(method: str, point: dict[str, Any], base_dir: Path, adapters: list[Path], *,
                        non_private: bool, noise_std: list[Any] | None = None) -> dict[str, Any]:
    """The mergekit configuration of ``method`` at ``point`` over ``base_dir+adapter`` inputs. ``non_private``:
    the inputs carry no DP guarantee, said by name to the methods that refuse them. ``noise_std``: per input, the
    per-tensor noise of the noise-injection arm (mergekit conditional parameters), given to the methods that
    read a noise level."""
    if method not in SPACES:
        raise ValueError(f"no search space for merge method {method!r}; known: {', '.join(SPACES)}")
    per_model = {key: value for key, value in point.items() if key in PER_MODEL}
    shared = {key: value for key, value in point.items() if key not in PER_MODEL}
    shared.update(FIXED.get(method, {}))
    if non_private and method in NOT_PRIVATE_OPT_IN:
        shared["allow_non_private"] = True
    models = []
    for index, adapter in enumerate(adapters):
        parameters = dict(per_model)
        if method not in ("cauchy_poe", "dp_aware"):
            parameters["weight"] = 1.0
        if noise_std is not None and method in ("cauchy_poe", "dp_aware"):
            parameters["noise_std"] = noise_std[index]
        models.append({"model": f"{base_dir}+{adapter}", **({"parameters": parameters} if parameters else {})})
    return {"merge_method": method, "base_model": str(base_dir), "models": models, "dtype": "float32",
            "parameters": shared}
