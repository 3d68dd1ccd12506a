"""Collect a DPSAMTrainer run's :class:`~hf_dpmerge.records.noise_record.NoiseStats` for its release.

The dp_aware merge derives each coordinate's noise variance from them (docs/design.md §6). All of it is computed
from the privatised gradients and what is built from them (Adam's v̂, the weights, the linearised noise response) or
from public hyper-parameters, so it is free in privacy. η_t is the learning rate each step used, replayed from the run's
scheduler and checked against the Σ_t η_t² of the first group in the trainer's ``dp_state``.
"""

from __future__ import annotations

import logging
import math
import warnings
from pathlib import Path
from typing import Any

import torch
from peft.utils import get_peft_model_state_dict
from transformers.optimization import get_scheduler

from hf_dpmerge.records.noise_record import NoiseStats

logger = logging.getLogger(__name__)
_HYPER = ("betas", "eps", "momentum", "dampening", "nesterov")


def _learning_rates(trainer: Any, optimizer: torch.optim.Optimizer) -> list[list[float]]:
    """η_t of every param group for the steps taken, from a replay of the run's scheduler."""
    args, steps = trainer.args, trainer.state.global_step
    total = trainer.state.max_steps or steps
    groups = [{"params": [torch.zeros(1)], "lr": g.get("initial_lr", g["lr"])} for g in optimizer.param_groups]
    replay = torch.optim.SGD(groups)
    scheduler = get_scheduler(
        args.lr_scheduler_type, optimizer=replay, num_warmup_steps=args.get_warmup_steps(total),
        num_training_steps=total, scheduler_specific_kwargs=args.lr_scheduler_kwargs,
    )
    history = []
    with warnings.catch_warnings():  # the replay steps the schedule without optimizer steps, on purpose
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(steps):
            history.append([g["lr"] for g in replay.param_groups])
            scheduler.step()
    return history


def _updated_steps(trainer: Any, optimizer: torch.optim.Optimizer, history: list[list[float]]) -> list[list[float]]:
    """Per param group, η_t of the steps that updated it: a head warm-up (docs/design.md §15.3) freezes every
    group but the head's for its first K steps, which then neither noise nor move those parameters."""
    warmup = trainer.args.head_warmup_step_count(trainer.state.max_steps or trainer.state.global_step)
    head = {id(p) for p, is_head in zip(trainer._params, trainer._is_head) if is_head}
    is_head = [bool(g["params"]) and all(id(p) in head for p in g["params"]) for g in optimizer.param_groups]
    return [[step[i] for t, step in enumerate(history) if is_head[i] or t >= warmup]
            for i in range(len(optimizer.param_groups))]


def collect_noise_stats(trainer: Any) -> NoiseStats | None:
    """The run's noise statistics, or None (with a log line) when they cannot be reproduced faithfully."""
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    if optimizer is None or trainer.state.global_step == 0:
        return None
    history = _updated_steps(trainer, optimizer, _learning_rates(trainer, optimizer))
    replayed, recorded = sum(lr**2 for lr in history[0]), trainer.dp_state.sum_lr_squared
    if not math.isclose(replayed, recorded, rel_tol=1e-6, abs_tol=1e-30):
        logger.warning("noise statistics not written: the replayed schedule's Σ η² %.6g differs from the run's %.6g",
                       replayed, recorded)
        return None
    group_of = {id(p): index for index, g in enumerate(optimizer.param_groups) for p in g["params"]}
    model = trainer.accelerator.unwrap_model(trainer.model)
    named = {n: p for n, p in model.named_parameters() if id(p) in group_of}
    groups = get_peft_model_state_dict(model, state_dict={n: torch.tensor(group_of[id(p)]) for n, p in named.items()})
    moments = {}
    for name, param in named.items():
        state = optimizer.state.get(param, {})
        if "exp_avg_sq" in state:
            beta2 = optimizer.param_groups[group_of[id(param)]]["betas"][1]
            moments[name] = state["exp_avg_sq"] / (1 - beta2 ** float(state["step"]))
    first = optimizer.param_groups[0]
    response = getattr(trainer, "noise_response", None)
    responses = {}
    if response is not None and response.steps == trainer.state.global_step:
        by_param = response.variances()
        responses = {name: by_param[param] for name, param in named.items() if param in by_param}
    elif response is not None:  # a resumed run followed only the steps after the resume point
        logger.info("the linearised noise response covers %d of %d steps (resumed run): not shipped",
                    response.steps, trainer.state.global_step)
    return NoiseStats(
        optimizer={"name": type(optimizer).__name__, **{k: first[k] for k in _HYPER if k in first}},
        noise_std=trainer.noise_std,
        lrs={str(i): torch.tensor(lrs, dtype=torch.float64) for i, lrs in enumerate(history)},
        weight_decay={str(i): float(g.get("weight_decay", 0.0)) for i, g in enumerate(optimizer.param_groups)},
        groups={name: str(int(index)) for name, index in groups.items()},
        second_moments=get_peft_model_state_dict(model, state_dict=moments) if moments else {},
        response_variances=get_peft_model_state_dict(model, state_dict=responses) if responses else {},
    )


def write_noise_stats(trainer: Any, directory: Path) -> None:
    """Write ``dp_noise_stats.safetensors`` into a release directory when the run's statistics are available."""
    stats = collect_noise_stats(trainer)
    if stats is not None:
        stats.save(directory)
