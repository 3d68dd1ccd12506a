"""Private evolutionary merge search: CMA-ES over per-model (optionally per-layer) merge weights, each generation's
choice made by an ε-DP mechanism (docs/design.md §13).

The search vector holds K weights per ``models:`` entry of a base mergekit config (K ≥ 2: a gradient over the
layers). Each of G generations, CMA-ES (the ``cma`` package, μ = 1 parent) proposes P vectors in [low, high]; each
is merged and scored as ``hf-dpmerge tune`` scores a candidate (task-averaged accuracy on public-size subsamples,
Δ = max_t m_t/(T·n_t)); ONE is chosen by the exponential mechanism (or permute-and-flip) at ε_sel / G, and
CMA-ES is told only that choice. The search's state depends on the choices and its own randomness only, so by
basic composition it is ε_sel-DP; the last choice is released (post-processing) with a ``dp_selection.json``
composed as tune's. Scores are never stored or printed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hf_dpmerge.analysis.task_run import TaskRun
from hf_dpmerge.merging.config_edit import with_parameter
from hf_dpmerge.records.selection_record import SelectionRecord
from hf_dpmerge.scripts.tune import (
    candidate_scratch,
    keep_chosen,
    merge_candidate,
    prepare_scoring,
)
from hf_dpmerge.training.dp.private_selection import DEFAULT_VALIDATION_SIZE, select_private


def weighted_config(config: dict[str, Any], vector: Sequence[float], layer_points: int) -> dict[str, Any]:
    """``config`` with model i's ``weight`` set to vector[i·K : (i+1)·K] (a float for K = 1, else a mergekit
    gradient over the layers)."""
    candidate = config
    for index in range(len(config["models"])):
        values = [round(float(v), 6) for v in vector[index * layer_points:(index + 1) * layer_points]]
        candidate = with_parameter(candidate, "weight", values[0] if layer_points == 1 else values, index)
    return candidate


def evolve_search(
    score: Callable[[int, Sequence[float]], float],
    *,
    dimension: int,
    start: float,
    generations: int,
    population: int,
    epsilon: float,
    sensitivity: float,
    mechanism: str,
    low: float,
    high: float,
    step: float,
    rng: np.random.Generator,
) -> tuple[list[list[float]], list[int]]:
    """The CMA-ES loop of the module docstring. ``score(index, x)`` is the utility of candidate ``index`` (its
    position among all candidates so far). CMA-ES samples from a generator spawned from ``rng`` (its ``randn``
    option; ``seed`` NaN: it neither seeds nor reads ``np.random``). Returns every candidate's vector and the index
    chosen in each generation (the last one is the result)."""
    import cma

    proposals_rng = rng.spawn(1)[0]  # CMA-ES's own stream: never NumPy's global state, which the scoring may touch
    options = {"popsize": population, "CMA_mu": 1, "bounds": [low, high], "verbose": -9, "seed": np.nan,
               "randn": lambda *shape: proposals_rng.standard_normal(shape)}
    search = cma.CMAEvolutionStrategy([start] * dimension, step, options)
    candidates: list[list[float]] = []
    chosen: list[int] = []
    epsilon_step = epsilon / generations
    for _ in range(generations):
        proposals = search.ask()
        offset = len(candidates)
        candidates += [[round(float(v), 6) for v in x] for x in proposals]  # as weighted_config writes them
        utilities = [score(offset + i, x) for i, x in enumerate(proposals)]
        pick = select_private(utilities, epsilon_step, sensitivity, mechanism, rng)
        chosen.append(offset + pick)
        # only the choice: it ranks first, the rest tie behind it in proposal order; with μ = 1 the pick alone sets
        # the new mean and step size, and the active covariance update reads the rest as "worse than the pick"
        search.tell(proposals, [0.0 if i == pick else 1.0 for i in range(len(proposals))])
    return candidates, chosen


def evolve_merge(
    config: dict[str, Any],
    runs: Sequence[TaskRun],
    output_dir: str | os.PathLike,
    *,
    epsilon: float,
    generations: int,
    population: int,
    mechanism: str,
    composition: str,
    base_dir: Path,
    layer_points: int = 1,
    low: float = 0.0,
    high: float = 2.0,
    step: float = 0.3,
    validation_size: int | Mapping[str, int] = DEFAULT_VALIDATION_SIZE,
    rows_per_unit: int = 1,
    lora_merge_cache: str | None = None,
    batch_size: int = 32,
    device: str | None = None,
    seed: int | None = None,
    log: Callable[[str], None] = print,
) -> SelectionRecord:
    """Search, select privately, keep the last generation's choice at ``output_dir`` with its selection record.
    ``seed`` seeds the subsamples, CMA-ES and the mechanism (default: OS entropy); the record says whether."""
    output_dir = Path(output_dir)
    if generations < 1 or population < 2 or layer_points < 1:
        raise ValueError(f"--generations must be ≥ 1, --population ≥ 2 and --layer_points ≥ 1, got {generations}, "
                         f"{population} and {layer_points}")
    if not low < high or not low <= 1.0 <= high or step <= 0:
        raise ValueError(f"--low < --high must bracket the start weight 1 and --step must be > 0, got {low}, {high}, "
                         f"{step}")
    rng = np.random.default_rng(seed)
    setup = prepare_scoring(runs, output_dir, epsilon=epsilon, composition=composition, base_dir=base_dir,
                            validation_size=validation_size, batch_size=batch_size, device=device, rng=rng,
                            seeded=seed is not None, command="evolve", rows_per_unit=rows_per_unit)

    def score(index: int, vector: Sequence[float]) -> float:
        log(f"generation {index // population + 1}/{generations}, candidate {index % population + 1}/{population}")
        utility = setup.utility(merge_candidate(weighted_config(config, vector, layer_points), scratch / str(index),
                                                lora_merge_cache, device))
        if index % population == population - 1:  # keep only this generation's merges until its choice is made
            for old in range(index - 2 * population + 1, index - population + 1):
                shutil.rmtree(scratch / str(old), ignore_errors=True)
        return utility

    with candidate_scratch(output_dir) as scratch:
        candidates, chosen = evolve_search(
            score, dimension=len(config["models"]) * layer_points, start=1.0, generations=generations,
            population=population, epsilon=epsilon, sensitivity=setup.sensitivity, mechanism=mechanism, low=low,
            high=high, step=step, rng=rng,
        )
        final = chosen[-1]
        record = setup.selection_record(
            mechanism, [{"weights": vector} for vector in candidates], final,
            extra={"search": "CMA-ES (cma, μ = 1), one private choice per generation, basic composition",
                   "generations": generations, "population": population, "epsilon_per_generation":
                   epsilon / generations, "chosen_per_generation": chosen, "layer_points": layer_points,
                   "bounds": [low, high], "step": step},
        )
        keep_chosen(scratch / str(final), output_dir, weighted_config(config, candidates[final], layer_points), record)
    return record
