"""Privacy accounting for DPSAMTrainer, delegated to opacus accountants (docs/design.md §9).

One optimizer step is one subsampled Gaussian mechanism at q = B_exp/N; k privatised queries of the same batch
(``two_query``) have sensitivity √k·C against noise σC each, i.e. one step at σ_eff = σ/√k, and the accountant
steps once per optimizer step at σ_eff. opacus' ε (``target_epsilon``, the budget, the record's ``epsilon``) is
add/remove-one. :func:`replace_one_epsilon` states the same run under replace-one with ``dp-accounting``'s PLD
accountant (Doroshenko et al. 2022, "Connect the Dots"; FFT composition, pessimistic rounding), whose
per-step dominating pair (contributions rescaled by C) is

    P = (1−q)·N(0, σ²) + q·N(+1, σ²),   Q = (1−q)·N(0, σ²) + q·N(−1, σ²)

its loss the sum of the add-one and remove-one losses, so replace-one ε ≥ add/remove ε.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dp_accounting import dp_event
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
from dp_accounting.privacy_accountant import NeighboringRelation
from opacus.accountants import create_accountant
from opacus.accountants.utils import get_noise_multiplier

from hf_dpmerge.records.record import ADD_REMOVE_ONE, REPLACE_ONE

ACCOUNTANTS = ("prv", "rdp")
History = list[tuple[float, float, int]]  # (σ_eff, q, steps) of each stretch of steps, as opacus keeps it


class PrivacyBudgetExhausted(RuntimeError):
    """Another optimizer step would spend more than the configured ε budget."""


@contextmanager
def quiet_prv_domain_bound(mechanism: str) -> Iterator[None]:
    """Silence opacus' "Optimal order is the largest alpha" on PRV calls: the PRV accountant bounds its
    discretisation domain with a loose internal RDP bound (``prv/domain.py``), whose order choice does not
    enter the reported ε. RDP runs keep the warning, where it does concern ε."""
    with warnings.catch_warnings():
        if mechanism == "prv":
            warnings.filterwarnings("ignore", message="Optimal order is the (largest|smallest) alpha")
        yield


def resolve_delta(target_delta: float | None, num_samples: int) -> float:
    """δ of the guarantee: ``target_delta`` when given, else 1/(10·N)."""
    return target_delta if target_delta is not None else 1 / (10 * num_samples)


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    target_delta: float,
    sample_rate: float,
    steps: int,
    accountant: str,
    queries_per_step: int = 1,
    epsilon_tolerance: float = 0.01,
    prior_history: History = (),
) -> float:
    """σ per query such that ``steps`` steps at σ_eff = σ/√queries_per_step reach at most ``target_epsilon``."""
    if prior_history:
        return calibrate_after(prior_history, target_epsilon=target_epsilon, target_delta=target_delta,
                               sample_rate=sample_rate, steps=steps, accountant=accountant,
                               epsilon_tolerance=epsilon_tolerance) * math.sqrt(queries_per_step)
    effective = _opacus_noise_multiplier(target_epsilon, target_delta, sample_rate, steps, accountant,
                                         epsilon_tolerance)
    return effective * math.sqrt(queries_per_step)


@functools.lru_cache(maxsize=256)
def _opacus_noise_multiplier(target_epsilon: float, target_delta: float, sample_rate: float, steps: int,
                             accountant: str, epsilon_tolerance: float) -> float:
    """opacus' σ_eff for (ε, δ, q, T), memoised per process: a pure function of its arguments whose bisection costs
    seconds (tens of accountant calls), asked again by every run of the same recipe."""
    with quiet_prv_domain_bound(accountant):
        return float(get_noise_multiplier(target_epsilon=target_epsilon, target_delta=target_delta,
                                          sample_rate=sample_rate, steps=steps, accountant=accountant,
                                          epsilon_tolerance=epsilon_tolerance))


def history_epsilon(mechanism: str, history: History, delta: float) -> float:
    """ε of an opacus accountant (``mechanism``) over ``history`` (stretches of any (σ_eff, q))."""
    history = tuple(tuple(entry) for entry in history if entry[2] > 0)
    return _accountant_epsilon(mechanism, history, delta) if history else 0.0


@functools.lru_cache(maxsize=1024)
def _accountant_epsilon(mechanism: str, history: tuple[tuple[float, float, int], ...], delta: float) -> float:
    """:func:`history_epsilon` of a non-empty history, memoised per process: a pure function of its arguments
    whose RDP or PRV call costs up to seconds, asked again at every log, by every bisection step of
    :func:`calibrate_after` and by every run of the same recipe."""
    probe = create_accountant(mechanism)
    probe.history = list(history)
    with quiet_prv_domain_bound(mechanism):
        return float(probe.get_epsilon(delta=delta))


def calibrate_after(prior_history: History, *, target_epsilon: float, target_delta: float, sample_rate: float,
                    steps: int, accountant: str, epsilon_tolerance: float = 0.01) -> float:
    """σ_eff such that ``prior_history`` followed by ``steps`` steps at (σ_eff, q) reaches ε in
    (target − tolerance, target] (bisection: ε decreases in σ). Refuses a prior that leaves no budget."""
    spent = history_epsilon(accountant, prior_history, target_delta)
    if spent >= target_epsilon:
        raise ValueError(f"the earlier phases already spend ε = {spent:.3g} of --target_epsilon {target_epsilon:g}: "
                         "give the later phase some budget (a smaller --head_phase_epsilon)")

    def total(sigma: float) -> float:
        return history_epsilon(accountant, [*prior_history, (sigma, sample_rate, steps)], target_delta)

    low, high = 0.0, 1.0
    at_high = total(high)  # each ε costs an accountant call (seconds with PRV): computed once per σ tried
    while at_high > target_epsilon:
        low, high = high, 2 * high
        if high > 1e4:
            raise ValueError(f"no noise multiplier reaches ε = {target_epsilon:g} after the earlier phases")
        at_high = total(high)
    while at_high < target_epsilon - epsilon_tolerance and high - low > 1e-6:
        middle = (low + high) / 2
        at_middle = total(middle)
        if at_middle > target_epsilon:
            low = middle
        else:
            high, at_high = middle, at_middle
    return high


PLD_DISCRETIZATION = 1e-3  # privacy-loss grid (rounded pessimistically): ε within 1e-3 of a 1e-4 grid, 10× faster
_PLD_RELATIONS = {ADD_REMOVE_ONE: NeighboringRelation.ADD_OR_REMOVE_ONE, REPLACE_ONE: NeighboringRelation.REPLACE_ONE}


def pld_history_epsilon(relation: str, history: History, delta: float) -> float:
    """ε after a history of Poisson(q)-subsampled Gaussian stretches (σ_eff, q, steps) under ``relation`` (PLD
    accountant: heterogeneous stretches compose by convolving their privacy-loss distributions)."""
    if relation not in _PLD_RELATIONS:
        raise ValueError(f"neighbouring relation must be one of {tuple(_PLD_RELATIONS)}, got {relation!r}")
    history = tuple((sigma, q, n) for sigma, q, n in history if n > 0 and q > 0)
    if not history:
        return 0.0
    if any(sigma == 0 for sigma, _, _ in history):
        return math.inf
    return _pld_epsilon(relation, history, delta)


@functools.lru_cache(maxsize=1024)
def _pld_epsilon(relation: str, history: tuple[tuple[float, float, int], ...], delta: float) -> float:
    """:func:`pld_history_epsilon` of a non-empty, noised history, memoised per process (a pure function of its
    arguments; the FFT composition costs up to seconds)."""
    accountant = PLDAccountant(_PLD_RELATIONS[relation], value_discretization_interval=PLD_DISCRETIZATION)
    for sigma, q, n in history:
        accountant.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), n)
    return float(accountant.get_epsilon(delta))


def pld_epsilon(
    relation: str, *, effective_noise_multiplier: float, sample_rate: float, steps: int, delta: float
) -> float:
    """ε after ``steps`` Poisson(q)-subsampled Gaussian steps at σ_eff, under ``relation`` (PLD accountant)."""
    return pld_history_epsilon(relation, [(effective_noise_multiplier, sample_rate, steps)], delta)


def replace_one_epsilon(*, effective_noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """ε of the same run under replace-one neighbours (see the module docstring for the dominating pair)."""
    # the swapped unit joins with probability q and contributes g or g′, ‖g − g′‖ ≤ 2C (worst case g′ = −g along
    # one axis); the rest of the batch is common to both datasets and cancels
    return pld_epsilon(
        REPLACE_ONE, effective_noise_multiplier=effective_noise_multiplier, sample_rate=sample_rate,
        steps=steps, delta=delta,
    )


class PrivacyAccountant:
    """An opacus accountant fixed to one (σ_eff, q), with a cached ε and a precomputed step budget.

    ``prior_history``: stretches (σ_eff, q, steps) that earlier phases of the same run spent on the same data
    (private LP-FT's head phase, docs/design.md §15.6); every ε here composes them with this phase's steps."""

    def __init__(self, mechanism: str, effective_noise_multiplier: float, sample_rate: float, delta: float,
                 prior_history: History = ()):
        if mechanism not in ACCOUNTANTS:
            raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {mechanism!r}")
        self.mechanism = mechanism
        self.effective_noise_multiplier = effective_noise_multiplier
        self.sample_rate = sample_rate
        self.delta = delta
        self.prior_history = [tuple(entry) for entry in prior_history]
        self._accountant = create_accountant(mechanism)
        self._epsilon_cache: tuple[int, float] | None = None
        self._replace_one_cache: tuple[int, float] | None = None

    @property
    def steps(self) -> int:
        return sum(n for _, _, n in self._accountant.history)

    @property
    def history(self) -> list[tuple[float, float, int]]:
        return list(self._accountant.history)

    def step(self) -> None:
        self._accountant.step(noise_multiplier=self.effective_noise_multiplier, sample_rate=self.sample_rate)

    def epsilon(self) -> float:
        """ε spent so far at ``delta`` (the earlier phases' before the first step); cached per step count (PRV calls
        cost seconds)."""
        steps = self.steps
        if self._epsilon_cache is None or self._epsilon_cache[0] != steps:
            self._epsilon_cache = (steps, history_epsilon(self.mechanism, [*self.prior_history, *self.history],
                                                          self.delta))
        return self._epsilon_cache[1]

    def epsilon_replace_one(self) -> float:
        """ε spent so far under replace-one neighbours (:func:`replace_one_epsilon`); cached per step count."""
        steps = self.steps
        if self._replace_one_cache is None or self._replace_one_cache[0] != steps:
            history = [*self.prior_history, (self.effective_noise_multiplier, self.sample_rate, steps)]
            self._replace_one_cache = (steps, pld_history_epsilon(REPLACE_ONE, history, self.delta))
        return self._replace_one_cache[1]

    def epsilon_after(self, steps: int) -> float:
        """ε of the prior history and ``steps`` steps at this accountant's (σ_eff, q), without touching its history."""
        return history_epsilon(self.mechanism, [*self.prior_history, (self.effective_noise_multiplier,
                                                                      self.sample_rate, steps)], self.delta)

    def max_steps_within(self, budget: float, upper: int) -> int:
        """The largest n ≤ ``upper`` with ε(n) ≤ ``budget`` (binary search; ε is increasing in n)."""
        if self.epsilon_after(upper) <= budget:
            return upper
        low, high = 0, upper  # ε(low) ≤ budget < ε(high)
        while high - low > 1:
            mid = (low + high) // 2
            if self.epsilon_after(mid) <= budget:
                low = mid
            else:
                high = mid
        return low

    def state_dict(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism,
            "effective_noise_multiplier": self.effective_noise_multiplier,
            "sample_rate": self.sample_rate,
            "delta": self.delta,
            "prior_history": self.prior_history,
            "history": self.history,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue a saved history; refuses a history spent at another mechanism, σ_eff or q."""
        hints = {  # q first: a changed batch also changes the calibrated σ, and the batch is what the user changed
            "mechanism": "resume with the same accountant (--accountant)",
            "sample_rate": "q = expected batch / N: resume with the same --per_device_train_batch_size (expected "
                           "batch) and training data",
            "effective_noise_multiplier": "σ is calibrated from --target_epsilon, --target_delta, --max_steps and "
                                          "--sam_mode (or set by --noise_multiplier): resume with the same values",
            "prior_history": "the earlier phases (private LP-FT's head phase) must be the same: resume the same run",
        }
        # checkpoints written before earlier phases existed hold none
        state = {**state, "prior_history": [tuple(entry) for entry in state.get("prior_history", [])]}
        for key, hint in hints.items():
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"checkpoint privacy state has {key}={state[key]!r} but this run uses {getattr(self, key)!r}; "
                    f"{hint}"
                )
        self._accountant.history = [tuple(entry) for entry in state["history"]]
        self._epsilon_cache = None
