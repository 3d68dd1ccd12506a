"""Score-weighted merging: per-input weights w = softmax(s / T) from user-supplied scores s (docs/design.md §13).

w_i = exp(s_i / T) / Σ_j exp(s_j / T). The temperature T > 0 sets how sharp the weighting is: T → ∞ gives
equal weights 1/N, T → 0 puts all the weight on the best-scored input. The weights sum to 1, so they
replace task arithmetic's sum by a convex combination; ``lambda`` still scales the result. The weights are
written into any mergekit method's per-model ``weight`` (task_arithmetic, ties, dp_aware, safe_merge, …).
Scores computed on private data are a release of that data: supply public scores, or select privately
with ``hf-dpmerge tune``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from hf_dpmerge.merging.config_edit import with_parameter


def softmax_weights(scores: Sequence[float], temperature: float) -> list[float]:
    """softmax(scores / temperature), computed stably (the maximum is subtracted first)."""
    if not scores:
        raise ValueError("no scores given")
    if not all(math.isfinite(s) for s in scores):
        raise ValueError(f"scores must be finite numbers, got {list(scores)}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"--temperature must be a positive number, got {temperature}")
    top = max(scores)
    exps = [math.exp((s - top) / temperature) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


def score_weighted_config(config: dict[str, Any], scores: Sequence[float], temperature: float) -> dict[str, Any]:
    """``config`` with ``models[i].parameters.weight`` = softmax(scores / temperature)_i, one score per model."""
    if len(scores) != len(config["models"]):
        raise ValueError(f"--scores gives {len(scores)} scores for {len(config['models'])} models; give one per "
                         "model, in the order of the config's 'models:' list")
    for index, weight in enumerate(softmax_weights(scores, temperature)):
        config = with_parameter(config, "weight", weight, model_index=index)
    return config
