"""The default recipe fitted to the data size (docs/workflow.md "How much data"): :func:`fit_to_data`.

The packaged recipe's expected batches (phase 2 and LP-FT's head phase: 1024) assume thousands of privacy units. For
N units, each expected batch the user did not set becomes ``B = min(recipe batch, ⌊MAX_SAMPLE_RATE·N⌋)`` (q ≤ 2/3,
which keeps every packaged task's recipe as it is: bbc_news' 1602 rows run at q = 0.64), and when the encoder's
batch shrinks from B₀ its steps (unless set) shrink with it, ``T = max(MIN_FITTED_STEPS, ⌈T₀·B/B₀⌉)``, so the
compute T·B falls with N, while its learning rates (unless set) keep the distance travelled, ``η = η₀·T₀/T``. The
noise in the averaged gradient is about σ(q, T, ε)·C/(qN) ∝ √T·C/(Nε), so T steps of ``η`` move as far as T₀ of
``η₀`` at the same signal-to-noise ratio. Head steps on cached features cost little and stay. Below
``MIN_TRAINING_UNITS`` the defaults refuse. Measured in benchmarks/reports/data_size/REPORT.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

MAX_SAMPLE_RATE = 2 / 3
MIN_TRAINING_UNITS = 100
MIN_FITTED_STEPS = 10
RULE = "B = min(B0, floor(2N/3)); T = max(10, ceil(T0*B/B0)); lr = lr0*T0/T"
"""The rule as the data-size study records it with its units (a changed rule reruns them)."""


def given_flags(parser, argv: Iterable[str]) -> set[str]:
    """The destinations of the flags ``argv`` sets itself (``--x v``, ``--x=v``, ``--no_x``), not by default."""
    words = {word.split("=", 1)[0] for word in argv if word.startswith("--")}
    return {action.dest for action in parser._actions if words & set(action.option_strings)}


def training_units(train, unit_column: str | None) -> int:
    """N: the training rows, or with a privacy unit column the distinct units."""
    return len(train) if unit_column is None else len(set(train[unit_column]))


def fitted_steps(recipe_steps: int, batch: int, recipe_batch: int) -> int:
    """The encoder's steps at a batch shrunk from ``recipe_batch`` to ``batch``: max(10, ⌈T₀·B/B₀⌉), at most T₀."""
    return min(recipe_steps, max(MIN_FITTED_STEPS, math.ceil(recipe_steps * batch / recipe_batch)))


def fit_to_data(task: str, script, config, train, given: set[str], head_phase: bool, encoder: bool = True,
                max_sample_rate: float = MAX_SAMPLE_RATE):
    """``(script, config)`` with the expected batches the user left to the recipe (``head_phase``: LP-FT's too), and
    the steps of a run that trains the encoder (``encoder``; a head-only run's are cheap and stay), fitted to N
    (module docstring; ``max_sample_rate`` bounds q: the causal recipe is near full-batch, q ≤ 1); refused below
    :data:`MIN_TRAINING_UNITS` when a default batch had to shrink, and whenever a batch (the user's) exceeds N,
    before anything is written."""
    units = training_units(train, config.privacy_unit_column)
    cap = int(max_sample_rate * units)
    world = max(config.world_size, 1)
    fits = {"per_device_train_batch_size": config.per_device_train_batch_size * world <= cap,
            "head_phase_batch_size": not head_phase or script.head_phase_batch_size * world <= cap}
    shrink = [name for name, fit in fits.items() if not fit and name not in given]
    if shrink and units < MIN_TRAINING_UNITS:
        raise ValueError(f"{task}: {units} training {_units(config)}; the default recipe needs at least "
                         f"{MIN_TRAINING_UNITS} privacy units (DP noise swamps fewer): add data, or set "
                         "--per_device_train_batch_size" + (" and --head_phase_batch_size" if head_phase else "")
                         + " yourself")
    if "per_device_train_batch_size" in shrink:
        batch = max(cap // world, 1)
        steps = config.max_steps
        if encoder and "max_steps" not in given:  # encoder steps: compute ∝ T·B
            steps = fitted_steps(steps, batch, config.per_device_train_batch_size)
        rates = {name: getattr(config, name) * config.max_steps / steps
                 for name in ("learning_rate", "head_learning_rate")
                 if name not in given and getattr(config, name) is not None}
        config = dataclasses.replace(config, per_device_train_batch_size=batch, max_steps=steps,
                                     physical_batch_size=min(config.physical_batch_size, batch), **rates)
    if "head_phase_batch_size" in shrink:
        script = dataclasses.replace(script, head_phase_batch_size=max(cap // world, 1))
    check_batch_fits(task, config, train)
    if head_phase and script.head_phase_batch_size * world > units:
        raise ValueError(f"{task}: the head phase's expected batch {script.head_phase_batch_size * world} exceeds "
                         f"the {units} training {_units(config)}: lower --head_phase_batch_size, or pass "
                         "--head_phase_share 0 (no head phase)")
    return script, config


def _units(config) -> str:
    return "rows" if config.privacy_unit_column is None else f"values of {config.privacy_unit_column}"


def check_batch_fits(task: str, config, train) -> None:
    """Refuse an expected batch larger than N before anything is written (a script whose recipe is not fitted to N:
    DPSAMTrainer would refuse it only after the base is written)."""
    units = training_units(train, config.privacy_unit_column)
    batch = config.per_device_train_batch_size * max(config.world_size, 1)
    if batch > units:
        raise ValueError(f"{task}: the expected batch {batch} exceeds the {units} training {_units(config)}: lower "
                         "--per_device_train_batch_size (the expected Poisson batch per device)")
