"""``--plan``'s time estimate: seconds per part of a grid on 2 idle CPU cores, from token counts."""

from __future__ import annotations

from typing import Any

import numpy as np

from .grid import Cell, is_headline
from .merge_space import BUDGET
from .units import Context, parse_train_arguments, train_arguments

# Time model of --plan, for MiniLM on 2 idle CPU cores. Throughput: MiniLM's measured fwd+bwd tokens per second;
# per-sample gradients cost 1.5–2× a plain step (1.75 taken), two_query makes two such queries; a forward pass ≈ 1/3
# of fwd+bwd; a Hessian-vector product (double backward) ≈ 3 fwd+bwd. Fixed costs per training run (data,
# tokenisation, model, σ calibration), per merge (mergekit, MiniLM: 2.4–5 s measured on the loaded smoke run), per
# data and model load.
TOKENS_PER_SECOND = 3400.0
TRAINER_COST = {"non_private": 1.0, "dp_sgd": 1.75, "dp_merging": 1.75, "two_query": 3.5}
FORWARD_COST, HVP_COST = 1 / 3, 3.0
RUN_OVERHEAD_S, MERGE_S, DATA_LOAD_S, MODEL_LOAD_S = 20.0, 10.0, 2.0, 1.5
MERGED_LOAD_S = 0.2  # load_merged_with_head (stress scoring), MiniLM from page cache: 0.09 s measured under load
HEAD_ONLY_COST = 0.5  # the floor: a full forward; backward and per-sample gradients stop at the head


def _task_token_counts(ctx: Context, task: str, script) -> dict[str, Any]:
    """Token lengths of the training split, and total tokens of the test and diagnostic subsets."""
    from transformers import AutoTokenizer

    from hf_dpmerge.data import default_model_path, load_task, tokenize_task

    tokenizer = AutoTokenizer.from_pretrained(ctx.model or default_model_path())
    splits, spec = load_task(task, max_train_samples=script.max_train_samples,
                             max_eval_samples=ctx.grid.max_eval_samples)
    lengths = {split: np.array([len(ids) for ids in data["input_ids"]])
               for split, data in tokenize_task(splits, spec, tokenizer, script.max_length).items()}
    validation = lengths["validation"]
    diagnostic = np.mean(validation) * min(ctx.grid.diagnostic_samples, len(validation))
    tuning = np.mean(validation) * min(ctx.grid.stress.validation_samples if ctx.grid.stress else 0, len(validation))
    return {"train_lengths": lengths["train"], "test_tokens": float(lengths["test"].sum()),
            "diagnostic_tokens": float(diagnostic), "tuning_tokens": float(tuning)}


def _training_seconds(ctx: Context, cell: Cell, config, count: dict[str, Any], rng) -> tuple[float, float]:
    """(training incl. its test prediction, adapter diagnostics) of one task's run in ``cell``."""
    seconds = 1 / TOKENS_PER_SECOND
    batch, steps = config.per_device_train_batch_size, config.max_steps
    lengths = count["train_lengths"]
    padded = np.mean([lengths[rng.integers(0, len(lengths), batch)].max() for _ in range(200)])
    cost = HEAD_ONLY_COST if not cell.merged else TRAINER_COST[cell.trainer]
    training = (RUN_OVERHEAD_S + steps * batch * padded * cost * seconds
                + count["test_tokens"] * FORWARD_COST * seconds)
    diagnostics = DATA_LOAD_S + MODEL_LOAD_S + count["diagnostic_tokens"] * seconds * (
        1 + FORWARD_COST + ctx.grid.hessian_iterations * HVP_COST)
    return training, diagnostics


def estimate_seconds(ctx: Context, cells: list[Cell]) -> dict[str, float]:
    """Seconds per part of the grid on 2 idle CPU cores, from token counts and the time model above.

    A training step costs B_exp × (mean longest row of a B_exp-row draw: padding is per draw) tokens × the
    trainer's cost; the power iteration is counted at its cap of Hessian-vector products.
    """
    rng = np.random.default_rng(0)
    parsed = {cell: parse_train_arguments(train_arguments(ctx, cell)) for cell in cells}
    counts = {task: _task_token_counts(ctx, task, parsed[cells[0]][0]) for task in ctx.grid.tasks}
    parts = dict.fromkeys(("training", "adapter diagnostics", "merging", "evaluation", "interpolation"), 0.0)
    seconds = 1 / TOKENS_PER_SECOND
    for cell in cells:
        for count in counts.values():
            training, diagnostics = _training_seconds(ctx, cell, parsed[cell][1], count, rng)
            parts["training"] += training
            parts["adapter diagnostics"] += diagnostics
        for _ in ctx.grid.merges:
            parts["merging"] += MERGE_S
            for count in counts.values():  # individual and merged model on the test subset
                parts["evaluation"] += DATA_LOAD_S + 2 * (MODEL_LOAD_S + count["test_tokens"] * FORWARD_COST * seconds)
                parts["interpolation"] += DATA_LOAD_S + 2 * MODEL_LOAD_S + len(ctx.grid.gammas) * (
                    count["diagnostic_tokens"] * FORWARD_COST * seconds)
    return parts


def estimate_stress_seconds(ctx: Context, cells: list[Cell]) -> dict[str, dict[str, float]]:
    """A stress grid's seconds per part, for its headline cells and for the rest (:func:`~.grid.is_headline`).

    Per cell: its trainings (none for noise cells) and diagnostics; its individual models on the validation and
    test subsets; per merge method, :data:`~.merge_space.BUDGET` merges each scored on the validation subsets,
    then the chosen one on the test subsets.
    """
    rng = np.random.default_rng(0)
    trained = [cell for cell in cells if cell.noise_std is None]
    parsed = {cell: parse_train_arguments(train_arguments(ctx, cell)) for cell in trained}
    counts = {task: _task_token_counts(ctx, task, parsed[trained[0]][0]) for task in ctx.grid.tasks}
    seconds = 1 / TOKENS_PER_SECOND
    names = ("training", "adapter diagnostics", "individual scoring", "merging", "merge scoring")
    estimate = {"headline": dict.fromkeys(names, 0.0), "rest": dict.fromkeys(names, 0.0)}
    for cell in cells:
        parts = estimate["headline" if is_headline(ctx.grid, cell) else "rest"]
        for count in counts.values():
            if cell.noise_std is None:
                training, diagnostics = _training_seconds(ctx, cell, parsed[cell][1], count, rng)
                parts["training"] += training
                parts["adapter diagnostics"] += diagnostics
            scored = (count["tuning_tokens"] + count["test_tokens"]) * FORWARD_COST * seconds
            parts["individual scoring"] += 2 * DATA_LOAD_S + MODEL_LOAD_S + scored  # one model for both splits
        if not cell.merged:
            continue
        for _ in ctx.grid.merges:
            parts["merging"] += BUDGET * MERGE_S
            for count in counts.values():
                parts["merge scoring"] += (BUDGET * (MERGED_LOAD_S + count["tuning_tokens"] * FORWARD_COST * seconds)
                                           + MERGED_LOAD_S + count["test_tokens"] * FORWARD_COST * seconds)
    return estimate
