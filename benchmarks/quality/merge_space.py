"""The stress grid's merges: each method's search space (the same budget for every method) and the mergekit
configuration of one point, generated per cell instead of read from ``merge_configs/*.yaml``.

Every output is W₀ + λ·(the method's combined task vector), and λ means different things on different scales
(docs/merging.md, "One scale convention"): the **sum** scale (Σᵢ τᵢ: task_arithmetic, dp_aware, cauchy_poe's ζ
for orthogonal tasks, and the sparsifying methods mergekit leaves unnormalised) or the **mean** scale (ties and della
normalise by the summed weights). Methods on one scale search the same λ grid (:data:`LAMBDAS`), and every method
has :data:`BUDGET` points: a method whose only knob is λ (task_arithmetic) fixes equal budgets at the grid's size,
so the other knobs (``density``, the Cauchy width floor ``tol``, dp_aware's ``consensus``) are set once per
method (:data:`FIXED`), not tuned. sce has no λ; its space is ``select_topk``. :mod:`.tuning` picks one point per
method and cell on the validation splits; a choice at either end of a grid axis is flagged (:func:`grid_edges`):
the optimum may lie outside the grid.

Stock mergekit 0.1.5 task-vector methods that apply to LoRA task vectors with a shared base: task_arithmetic,
ties, dare_ties, dare_linear, della, della_linear, breadcrumbs, breadcrumbs_ties, sce (linear, model_stock,
karcher, slerp-family and passthrough average or interpolate whole models instead, and have no scale to tune
alike). Randomised methods (DARE, DELLA) draw their masks from mergekit's ``--random-seed`` (the cell's seed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hf_dpmerge.merging.merge_config import lora_reference, mergekit_config

LAMBDAS: dict[str, tuple[float, ...]] = {
    "sum": (0.25, 0.5, 0.75, 1.0),  # six summed task vectors: the earlier grids' choices lay in 0.25–1
    "mean": (0.5, 1.0, 1.5, 2.0),  # the normalised merge: the earlier grids chose λ = 1, their top, almost always
}
SCALE: dict[str, str] = {
    "task_arithmetic": "sum", "dp_aware": "sum", "cauchy_poe": "sum", "dare_ties": "sum", "dare_linear": "sum",
    "della_linear": "sum", "breadcrumbs": "sum", "breadcrumbs_ties": "sum", "ties": "mean", "della": "mean",
}
# shared ("consensus", "tol", "dp_calibrated", "select_topk") and per-model ("density", "epsilon", "gamma") knobs,
# set for every point: the value the earlier (λ × knob) grids chose on validation most often, or the sibling's
FIXED: dict[str, dict[str, Any]] = {
    "ties": {"density": 0.5}, "dare_ties": {"density": 0.5}, "dare_linear": {"density": 0.5},
    "della": {"density": 0.3, "epsilon": 0.1}, "della_linear": {"density": 0.3, "epsilon": 0.1},
    "breadcrumbs": {"density": 0.5, "gamma": 0.01}, "breadcrumbs_ties": {"density": 0.5, "gamma": 0.01},
    "cauchy_poe": {"tol": 0.1, "dp_calibrated": True},  # each input's width from its noise (0 without DP noise)
    "dp_aware": {"consensus": "none"},
}
SPACES: dict[str, tuple[dict[str, Any], ...]] = {
    **{method: tuple({"lambda": value} for value in LAMBDAS[scale]) for method, scale in SCALE.items()},
    "sce": tuple({"select_topk": value} for value in (0.1, 0.3, 0.6, 1.0)),
}
BUDGET = len(SPACES["task_arithmetic"])
PER_MODEL = ("density", "epsilon", "gamma")
NOT_PRIVATE_OPT_IN = ("dp_aware",)  # refuse inputs without a DP guarantee unless told (`allow_non_private`)

if any(len(points) != BUDGET for points in SPACES.values()):
    raise AssertionError(f"every method's space has {BUDGET} points")


def grid_edges(method: str, point: dict[str, Any]) -> list[str]:
    """The tuned axes of ``method`` whose value in ``point`` is the smallest or largest of its grid (an axis of
    ≥ 3 numeric values; with 2 every choice is an edge and says nothing)."""
    edges = []
    for axis, value in point.items():
        values = sorted({p[axis] for p in SPACES[method] if isinstance(p.get(axis), (int, float))})
        if len(values) >= 3 and value in (values[0], values[-1]):
            edges.append(axis)
    return edges


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
    settings = {**FIXED.get(method, {}), **point}
    per_model = {key: value for key, value in settings.items() if key in PER_MODEL}
    shared = {key: value for key, value in settings.items() if key not in PER_MODEL}
    if non_private and method in NOT_PRIVATE_OPT_IN:
        shared["allow_non_private"] = True
    settings_per_model = []
    for index in range(len(adapters)):
        parameters = dict(per_model)
        if method not in ("cauchy_poe", "dp_aware"):
            parameters["weight"] = 1.0
        if noise_std is not None and method in ("cauchy_poe", "dp_aware"):
            parameters["noise_std"] = noise_std[index]
        settings_per_model.append(parameters)
    return mergekit_config(method, base_dir, [lora_reference(base_dir, adapter) for adapter in adapters],
                           parameters=shared, per_model=settings_per_model)
