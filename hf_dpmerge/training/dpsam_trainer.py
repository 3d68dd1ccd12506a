"""``DPSAMTrainer``: DP-SGD + DP-compatible sharpness-aware steps + drift alignment for peft LoRA models.

One optimizer step (DP-Merging Algorithm 1, with the DP-SAT / per-example variants of docs/design.md §2–§3):

    B ~ Poisson(q) over the training set                         (one draw per step)
    e = ρ·g̃_{t−1}/‖g̃_{t−1}‖   (dp_sat)  |  ρ·g̃/‖g̃‖ from a 1st query (two_query)  |  0 (none)
    g̃ = (Σ_{i∈B} clip_C(∇ℓ_i(w + e)) + N(0, σ²C²I)) / B_exp    (per_example: each i ascends on its own)
    w ← optimizer(w, g̃ + ∇R(w) + ∇A(w)),   R(w) = λ·Σ‖s·B·A‖_F² (LoRA deltas only)

A is a causal LM's public anchor (:mod:`.public_anchor`), added after the noise like R (no private data). The
accountant steps once per step at σ_eff (σ/√2 for two_query); the DP state is ``trainer.dp_state``
(:class:`~hf_dpmerge.training.dp.state.DPState`). Head warm-up: §15.3; multi-process and user-level runs: §3, §9.
The record, ``save_model`` and ``push_to_hub`` (the release): :class:`~hf_dpmerge.training.release.ReleaseMixin`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import datasets
import numpy as np
import torch
from opacus import GradSampleModule
from torch import nn
from torch.utils.data import DataLoader
from transformers import Trainer

from hf_dpmerge.data.instructions import IGNORE_INDEX
from hf_dpmerge.lora import lora_factors, penalty_curvature
from hf_dpmerge.modeling.per_example_loss import per_example_loss
from hf_dpmerge.modeling.sam_ascent import ascent_step, perturbed
from hf_dpmerge.noise.linearised_response import AdamNoiseResponse, supports_noise_response
from hf_dpmerge.records.record import privacy_unit_name
from hf_dpmerge.training.alignment import alignment_penalty
from hf_dpmerge.training.checks import (
    check_adapter_type,
    check_anchor_rows,
    check_finite_step,
    check_full_precision_trainable,
    check_labels,
    check_no_gradient_checkpointing,
    check_no_model_selection,
    check_sized_dataset,
    check_tokenized,
)
from hf_dpmerge.training.dp.accounting import PrivacyAccountant, calibrate_noise_multiplier, resolve_delta
from hf_dpmerge.training.dp.cross_process import main_process_value, shared_seed, sum_over_processes
from hf_dpmerge.training.dp.micro_batches import micro_batches
from hf_dpmerge.training.dp.poisson_loader import UNIT_KEY, poisson_dataloader
from hf_dpmerge.training.dp.privatizer import GradientPrivatizer
from hf_dpmerge.training.dp.run_streams import NOISE_STREAM, SAMPLING_STREAM, dataset_identity, stream_seed
from hf_dpmerge.training.dp.state import (
    DPState,
    DPStateCallback,
    last_complete_checkpoint,
    mid_epoch_checkpoint,
    missing_checkpoint_files,
    seeded_generator,
)
from hf_dpmerge.training.dpsam_config import DPSAMConfig
from hf_dpmerge.training.iterate_average import IterateAverageCallback
from hf_dpmerge.training.public_anchor import anchor_divergence
from hf_dpmerge.training.release import ReleaseMixin
from hf_dpmerge.training.sam import per_example_sam_grads, queries_per_step
from hf_dpmerge.utils.quiet import expected_warnings_ignored

logger = logging.getLogger(__name__)
# opacus registers full backward hooks on modules whose inputs (frozen activations) need no gradient;
# PyTorch warns about that on every micro-batch although the per-sample gradients are correct.
warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed")


def _split_unit_column(dataset: Any, column: str | None) -> tuple[np.ndarray | None, Any]:
    """(unit code 0..N_units−1 of every row, ``dataset`` without ``column``); (None, dataset) when no column."""
    if column is None:
        return None, dataset
    if not isinstance(dataset, datasets.Dataset):
        raise TypeError(
            f"privacy_unit_column={column!r} needs the training set as a datasets.Dataset holding that column, "
            f"got {type(dataset).__name__}"
        )
    if column not in dataset.column_names:
        raise ValueError(
            f"privacy_unit_column={column!r} is not a column of the training set (columns: {dataset.column_names}); "
            "keep the unit column through tokenization or unset privacy_unit_column"
        )
    values = dataset[column]
    if any(value is None for value in values):
        raise ValueError(f"privacy_unit_column={column!r} has missing values: every row needs a unit")
    _, codes = np.unique(np.asarray([str(value) for value in values]), return_inverse=True)
    return codes.astype(np.int64), dataset.remove_columns(column)


@contextlib.contextmanager
def frozen_parameters(params: list[nn.Parameter]) -> Iterator[None]:
    """``requires_grad = False`` on ``params`` inside the block (no per-sample gradient, not in the clipped
    vector, no noise), restored after it."""
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


class DPSAMTrainer(ReleaseMixin, Trainer):
    """A ``transformers.Trainer`` whose steps are differentially private and sharpness/drift aware."""

    args: DPSAMConfig
    needs_token_ids: bool = True  # the training rows are token ids (a subclass may train on other inputs)

    def __init__(self, model: nn.Module, args: DPSAMConfig, train_dataset: Any = None, *,
                 earlier_phases: Sequence[Mapping[str, Any]] = (), anchor_rows: datasets.Dataset | None = None,
                 **kwargs: Any):
        """``earlier_phases``: :meth:`privacy_phase` of earlier runs of the same training on the same data (private
        LP-FT's head phase, docs/design.md §15.6): the accountant composes them with this run's steps.
        ``anchor_rows``: the public anchor's tokenised rows (:func:`~hf_dpmerge.training.public_anchor.anchor_rows`),
        needed by and only by ``anchor_lambda`` > 0."""
        if not isinstance(args, DPSAMConfig):
            raise TypeError(f"DPSAMTrainer needs a DPSAMConfig, got {type(args).__name__}")
        self.earlier_phases = [dict(phase) for phase in earlier_phases]
        if train_dataset is None:
            raise ValueError("DPSAMTrainer needs a train_dataset (its size N sets the sample rate q = B_exp/N)")
        check_sized_dataset(train_dataset)
        if self.needs_token_ids:
            check_tokenized(train_dataset)
        self.unit_of_row, train_dataset = _split_unit_column(train_dataset, args.privacy_unit_column)
        super().__init__(model=model, args=args, train_dataset=train_dataset, **kwargs)
        launched = int(os.environ.get("WORLD_SIZE", args.world_size))  # set by torchrun / accelerate launchers
        if launched != args.world_size:
            raise RuntimeError(
                f"{launched} processes were launched (WORLD_SIZE) but this one is in a process group of "
                f"{args.world_size}, so each would train and write on its own; on a machine without GPUs pass "
                "--use_cpu (use_cpu=True) so that accelerate joins them over gloo"
            )

        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("the model has no trainable parameters: wrap it with peft.get_peft_model first")
        check_adapter_type(self.model, args.dp, args.sam_mode)
        if args.dp:
            check_no_gradient_checkpointing(self.model)
            check_full_precision_trainable(named)
        check_labels(train_dataset, self.model, args.label_names)
        self._param_names = [n for n, _ in named]
        self._params = [p for _, p in named]
        # R(w) acts on trainable LoRA factors only: with all of them frozen (a head-only run) it is skipped
        # and the record says λ = 0 (lora_factors also refuses DoRA / LoRA biases / conv LoRA up front)
        self.align_lambda = args.align_lambda if args.align_lambda > 0 and any(
            f.lora_a.requires_grad or f.lora_b.requires_grad for f in lora_factors(self.model)) else 0.0
        self._proximal_anchor: list[torch.Tensor] | None = None  # θ₀ of FedProx's term, taken at the first step
        self.anchor_lambda, self.anchor_rows = args.anchor_lambda, anchor_rows
        self._anchor_batches: list[dict[str, torch.Tensor]] | None = None  # the anchor rows, collated once
        check_anchor_rows(anchor_rows, args.anchor_lambda, train_dataset)
        self.noise_response: AdamNoiseResponse | None = None  # set by create_optimizer under DP with Adam(W)

        self.num_samples = len(train_dataset)
        self.num_units = self.num_samples if self.unit_of_row is None else int(self.unit_of_row.max()) + 1
        self.expected_batch_size = args.per_device_train_batch_size * args.world_size
        if self.expected_batch_size > self.num_units:
            what = "dataset size"
            if self.unit_of_row is not None:
                what = f"number of privacy units ({args.privacy_unit_column})"
            raise ValueError(f"expected batch size {self.expected_batch_size} exceeds the {what} {self.num_units}: "
                             "lower --per_device_train_batch_size (the expected Poisson batch)")
        self.sample_rate = self.expected_batch_size / self.num_units
        self.steps_per_epoch = int(1 / self.sample_rate)
        self.planned_steps = (
            args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * self.steps_per_epoch)
        )
        self.queries_per_step = queries_per_step(args.sam_mode)
        # the global Poisson draw is made identically by every process; noise is drawn by the main one only.
        # A dp_seed seeds this run's own streams: derived from the seed and the training data's identity.
        sample_seed = noise_seed = None
        if args.dp_seed is not None:
            identity = main_process_value(self.accelerator, lambda: dataset_identity(train_dataset))
            # a later phase of one accounted run draws streams of its own: the phases' noise must be independent
            after = "".join(f"/after:{phase['name']}" for phase in self.earlier_phases)
            sample_seed = stream_seed(args.dp_seed, identity, SAMPLING_STREAM + after)
            noise_seed = stream_seed(args.dp_seed, identity, NOISE_STREAM + after)
        self.dp_state = DPState(
            sample_generator=seeded_generator(shared_seed(self.accelerator, sample_seed)),
            noise_generator=seeded_generator(noise_seed, self._params[0].device),
        )

        # head warm-up (linear probe, then fine-tune): the first head_warmup_steps steps train the task head only
        self._is_head = [".modules_to_save." in n for n in self._param_names]
        if args.head_warmup_steps > 0 and not any(self._is_head):
            raise ValueError("head_warmup_steps > 0 needs a task head to warm up (peft modules_to_save); the model "
                             "has none: set head_warmup_steps=0")
        self.privatizer: GradientPrivatizer | None = None
        self.head_privatizer: GradientPrivatizer | None = None
        self._grad_sample_module: GradSampleModule | None = None
        if args.dp:
            self._setup_privacy()
        self.add_callback(DPStateCallback(self.dp_state, self._load_rng_state, self.log))
        self.iterate_average = (IterateAverageCallback(self._params, args.average_last_steps, self.planned_steps)
                                if args.average_last_steps > 0 else None)
        if self.iterate_average is not None:
            self.add_callback(self.iterate_average)

    # ------------------------------------------------------------------ DP state, read-only
    @property
    def accountant(self) -> PrivacyAccountant | None:
        """The run's privacy accountant (``dp_state.accountant``); None without DP."""
        return self.dp_state.accountant

    @property
    def allowed_steps(self) -> int | None:
        """How many steps the ε budget allows (``dp_state.allowed_steps``); None without DP."""
        return self.dp_state.allowed_steps

    @property
    def sum_lr_squared(self) -> float:
        """Σ_t η_t² of the first param group over the steps taken (``dp_state.sum_lr_squared``)."""
        return self.dp_state.sum_lr_squared

    @property
    def noise_std(self) -> float:
        """σ_g = σ·C/B_exp, the noise std of one coordinate of a step's privatised mean gradient; 0 without DP."""
        if self.privatizer is None:
            return 0.0
        return self.noise_multiplier * self.privatizer.sensitivity / self.expected_batch_size

    @property
    def sample_generator(self) -> torch.Generator:
        """The generator of the Poisson draws (``dp_state.sample_generator``)."""
        return self.dp_state.sample_generator

    # ------------------------------------------------------------------ privacy set-up
    def _setup_privacy(self) -> None:
        args = self.args
        if args.n_gpu > 1:
            raise ValueError(
                f"one process sees {args.n_gpu} GPUs (torch DataParallel), which per-sample gradients do not "
                "support: launch one process per GPU with `accelerate launch --num_processes N`"
            )
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            raise ValueError(
                "DP training needs whole per-sample gradients of every trainable parameter on each process: "
                "DeepSpeed and FSDP shard them; use plain multi-process (DDP) launching"
            )
        self.delta = resolve_delta(args.target_delta, self.num_units)
        if self.delta >= 1 / self.num_units and not args.allow_large_delta:
            raise ValueError(
                f"target_delta={self.delta:g} ≥ 1/N = {1 / self.num_units:g} (N privacy units): such a δ allows "
                "releasing whole records; pick δ < 1/N or set allow_large_delta=True"
            )
        # computed once, by the main process, so every process holds the same σ and step budget
        self.noise_multiplier, self.dp_state.allowed_steps = main_process_value(self.accelerator, self._calibrate)
        self.effective_noise_multiplier = self.noise_multiplier / math.sqrt(self.queries_per_step)
        self.dp_state.accountant = PrivacyAccountant(
            args.accountant, self.effective_noise_multiplier, self.sample_rate, self.delta, self._prior_history
        )
        logger.info(
            "DP-SGD: N=%d rows, %d privacy units (%s), B_exp=%d, q=%.5f, steps=%d, σ=%.4f (σ_eff=%.4f), C=%g, "
            "δ=%.3g, accountant=%s",
            self.num_samples, self.num_units, privacy_unit_name(args.privacy_unit_column), self.expected_batch_size,
            self.sample_rate, self.planned_steps,
            self.noise_multiplier, self.effective_noise_multiplier, args.per_sample_max_grad_norm,
            self.delta, args.accountant,
        )
        self.privatizer = self._privatizer(self._params)
        if args.head_warmup_steps > 0:  # the same mechanism on the head's coordinates only
            self.head_privatizer = self._privatizer([p for p, head in zip(self._params, self._is_head) if head])
        if args.sam_mode != "per_example":
            self._grad_sample_module = GradSampleModule(
                self.model, batch_first=True, loss_reduction="sum", strict=False
            )

    @property
    def _prior_history(self) -> list[tuple[float, float, int]]:
        """The earlier phases as accountant stretches (σ_eff, q, steps)."""
        return [(p["effective_noise_multiplier"], p["sample_rate"], p["steps"]) for p in self.earlier_phases]

    def privacy_phase(self, name: str) -> dict[str, Any]:
        """This run as one phase of a longer accounted training (``earlier_phases`` of the next run): its name and
        (σ, σ_eff, q, B_exp, steps taken); public quantities only."""
        if self.dp_state.accountant is None:
            raise ValueError("a non-private run is no privacy phase")
        return {"name": name, "noise_multiplier": self.noise_multiplier,
                "effective_noise_multiplier": self.effective_noise_multiplier, "sample_rate": self.sample_rate,
                "expected_batch_size": self.expected_batch_size, "steps": self.dp_state.accountant.steps}

    def _privatizer(self, params: list[nn.Parameter]) -> GradientPrivatizer:
        """The Gaussian mechanism (σ, C, B_exp, the run's noise generator) on the clipped vector of ``params``."""
        return GradientPrivatizer(
            params,
            max_grad_norm=self.args.per_sample_max_grad_norm,
            noise_multiplier=self.noise_multiplier,
            expected_batch_size=self.expected_batch_size,
            generator=self.dp_state.noise_generator,
            adds_noise=self.accelerator.is_main_process,
            sum_over_processes=self._sum_over_processes,
            clipping=self.args.clipping,
            gamma=self.args.clipping_gamma,
        )

    def _calibrate(self) -> tuple[float, int]:
        """σ (explicit, or calibrated to the target ε) and the number of steps the ε budget allows at σ."""
        args = self.args
        if args.noise_multiplier is not None:
            noise_multiplier = float(args.noise_multiplier)
        else:
            noise_multiplier = calibrate_noise_multiplier(
                target_epsilon=args.target_epsilon,
                target_delta=self.delta,
                sample_rate=self.sample_rate,
                steps=self.planned_steps,
                accountant=args.accountant,
                queries_per_step=self.queries_per_step,
                prior_history=self._prior_history,
            )
        accountant = PrivacyAccountant(
            args.accountant, noise_multiplier / math.sqrt(self.queries_per_step), self.sample_rate, self.delta,
            self._prior_history,
        )
        budget = args.epsilon_budget if args.epsilon_budget is not None else args.target_epsilon
        allowed_steps = (accountant.max_steps_within(budget, self.planned_steps) if budget is not None
                         else self.planned_steps)
        if allowed_steps < self.planned_steps:
            logger.warning(
                "ε budget %.3g allows %d of the %d planned steps at σ=%.4g; training will stop there",
                budget, allowed_steps, self.planned_steps, noise_multiplier,
            )
        return noise_multiplier, allowed_steps

    # ------------------------------------------------------------------ data
    def get_train_dataloader(self) -> DataLoader:
        """Poisson draws of expected size B_exp under DP; the stock shuffled loader otherwise."""
        if not self.args.dp:
            return super().get_train_dataloader()
        dataset, collator = self.train_dataset, self.data_collator
        if isinstance(dataset, datasets.Dataset):
            dataset = self._remove_unused_columns(dataset, description="training")
        else:
            collator = self._get_collator_with_removed_columns(collator, description="training")
        return poisson_dataloader(
            dataset,
            collator,
            sample_rate=self.sample_rate,
            steps=self.steps_per_epoch,
            generator=self.dp_state.sample_generator,
            num_workers=self.args.dataloader_num_workers,
            num_processes=self.args.world_size,
            process_index=self.args.process_index,
            unit_of_row=self.unit_of_row,
        )

    # ------------------------------------------------------------------ optimizer
    def create_optimizer(self):
        """The stock optimizer; with ``head_learning_rate`` each param group is split so the task head
        (peft ``modules_to_save``) steps at that rate. Encoder groups stay first: the privacy record's
        Σ η² (used by the dp_aware merge) is the encoder's."""
        optimizer = super().create_optimizer()
        head_lr = self.args.head_learning_rate
        if head_lr is not None:
            head = {id(p) for n, p in self.model.named_parameters() if p.requires_grad and ".modules_to_save." in n}
            groups = [dict(g, params=[p for p in g["params"] if id(p) not in head]) for g in optimizer.param_groups]
            groups += [dict(g, params=[p for p in g["params"] if id(p) in head], lr=head_lr)
                       for g in optimizer.param_groups]
            optimizer.param_groups = [g for g in groups if g["params"]]
        self._follow_noise_response(optimizer)
        return optimizer

    def _follow_noise_response(self, optimizer: torch.optim.Optimizer) -> None:
        """Under DP with Adam(W), follow each coordinate's linearised noise variance along the run
        (:class:`AdamNoiseResponse`, shipped in ``dp_noise_stats.safetensors`` for the dp_aware merge)."""
        if self.noise_response is not None:
            self.noise_response.remove()
            self.noise_response = None
        if self.noise_std == 0 or not supports_noise_response(optimizer):
            return
        self.noise_response = AdamNoiseResponse(optimizer, self.noise_std, self._restoring_forces)

    def _restoring_forces(self) -> dict[nn.Parameter, torch.Tensor | float]:
        """The data-free terms' restoring force h per parameter (the step adds h·δp to the gradient's response):
        the alignment penalty's diagonal curvature on LoRA factors, FedProx's μ on every parameter."""
        forces: dict[nn.Parameter, torch.Tensor | float] = {}
        if self.align_lambda > 0:
            for factor in lora_factors(self.model):
                forces[factor.lora_a], forces[factor.lora_b] = penalty_curvature(factor, self.align_lambda)
        if self._proximal_anchor is not None:
            for param in self._params:
                forces[param] = forces.get(param, 0.0) + self.args.proximal_mu
        return forces

    # ------------------------------------------------------------------ one step
    def training_step(
        self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None
    ) -> torch.Tensor:
        """One private (or like-for-like non-private) step; leaves g̃ + ∇R in ``p.grad``.

        Under multi-process launching Trainer wraps the model in DistributedDataParallel. The wrapper is kept for
        what it does well (broadcasting the main process's initial weights at wrapping; Trainer's evaluation and
        saving paths) but the forward passes here call the unwrapped model: DDP's reducer averages gradients
        that ``.backward()`` accumulates, whereas this step takes per-sample gradients with
        ``torch.autograd.grad``, sets ``p.grad`` itself and all-reduces the clipped sums once per query
        (:class:`GradientPrivatizer`); skipping DDP's forward also skips its per-forward buffer broadcast and
        unused-parameter search, which this step does not need.
        """
        self.dp_state.check_budget()
        model = self.accelerator.unwrap_model(model)
        model.train()
        inputs = self._prepare_inputs(inputs)
        units = inputs.pop(UNIT_KEY, None)
        if "labels" not in inputs:
            raise ValueError("DPSAMTrainer needs 'labels' in every batch")
        if self.args.proximal_mu > 0 and self._proximal_anchor is None:
            if self.state.global_step > 0:
                raise ValueError("proximal_mu: the proximal term's anchor θ₀ is the weights at the first step, which "
                                 "a resumed run no longer has; train from the start (or set proximal_mu=0)")
            self._proximal_anchor = [p.detach().clone() for p in self._params]
        warmup = self.state.global_step < self.args.head_warmup_step_count(self.state.max_steps)
        frozen = [p for p, head in zip(self._params, self._is_head) if warmup and not head]
        with frozen_parameters(frozen):
            loss, gradient = self._private_step(model, inputs, units, warmup)
        check_finite_step(self.state.global_step + 1, loss, gradient, self._param_names)
        frozen_ids = {id(p) for p in frozen}
        for p, g in zip(self._params, gradient):  # frozen: no gradient, so the optimizer leaves them untouched
            p.grad = None if id(p) in frozen_ids else g.to(p.dtype)
        # Σ η² is the encoder's (the first param group): it takes no noisy step during the head warm-up
        self.dp_state.record_step(0.0 if frozen else self.optimizer.param_groups[0]["lr"])
        return loss

    def _private_step(self, model: nn.Module, inputs: dict[str, Any], units: torch.Tensor | None,
                      warmup: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The step's loss and g̃ + ∇R (SAM ascent per ``sam_mode``; R skipped during the head warm-up), plus
        FedProx's μ·(θ − θ₀) with ``proximal_mu``."""
        mode, rho = self.args.sam_mode, self.args.sam_rho
        with expected_warnings_ignored():  # hooks above a cached prefix, whose inputs need no gradient
            if mode == "dp_sat":
                previous = self.dp_state.previous_gradient
                with perturbed(self._params, ascent_step(previous, rho) if previous is not None else None):
                    gradient, loss = self._query(model, inputs, units)
                self.dp_state.previous_gradient = gradient
            elif mode == "two_query":
                first, loss = self._query(model, inputs, units)
                with perturbed(self._params, ascent_step(first, rho)):
                    gradient, _ = self._query(model, inputs, units)
            else:
                gradient, loss = self._query(model, inputs, units)

        if self.align_lambda > 0 and not warmup:
            with torch.enable_grad():
                penalty = alignment_penalty(model, self.align_lambda)
                penalty_grads = torch.autograd.grad(penalty, self._params, allow_unused=True)
            gradient = [g if pg is None else g + pg for g, pg in zip(gradient, penalty_grads)]
        if self.anchor_lambda > 0 and not warmup:  # public data and the weights only: after the noise
            gradient = [g if a is None else g + a for g, a in zip(gradient, self._anchor_gradient(model))]
        if self._proximal_anchor is not None:  # FedProx: μ·(θ − θ₀), data-free, after the noise
            mu = self.args.proximal_mu
            gradient = [g + mu * (p.detach() - anchor) for g, p, anchor in
                        zip(gradient, self._params, self._proximal_anchor)]
        return loss, gradient

    def _query(
        self, model: nn.Module, inputs: dict[str, torch.Tensor], units: torch.Tensor | None = None
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The (privatised, when dp) mean gradient of the draw at the current weights, and its mean loss,
        both over the whole draw (all processes' shares). ``units`` (each row's unit code) makes the
        privatiser clip per unit: row gradients are summed per unit across micro-batches, then clipped."""
        labels = inputs["labels"]
        active = [i for i, p in enumerate(self._params) if p.requires_grad]  # all but those a warm-up froze
        params, names = [self._params[i] for i in active], [self._param_names[i] for i in active]
        privatizer = self.privatizer
        if privatizer is not None and len(active) < len(self._params):
            privatizer = self.head_privatizer
        unit_positions, num_units = None, 0
        if units is not None and privatizer is not None:
            codes, unit_positions = torch.unique(units, return_inverse=True)
            num_units = len(codes)
        batch = labels.shape[0]
        features = {k: v for k, v in inputs.items() if k != "labels"}
        sums = [torch.zeros_like(p) for p in params]
        loss_total = torch.zeros((), device=labels.device)
        for micro_features, micro_labels, rows in micro_batches(features, labels, self.args.physical_batch_size):
            if self.args.sam_mode == "per_example":
                grads = per_example_sam_grads(
                    model, names, params, {**micro_features, "labels": micro_labels}, self._example_losses,
                    self.args.sam_rho,
                )
                with torch.no_grad():
                    loss_total += self._example_losses(model, micro_features, micro_labels).sum()
                if privatizer is not None:
                    privatizer.accumulate(grads)
                else:
                    for total, g in zip(sums, grads):
                        total.add_(g.sum(dim=0))
                continue
            loss_sum = self._example_losses(model, micro_features, micro_labels).sum()
            params_grads = torch.autograd.grad(loss_sum, params, allow_unused=True)
            loss_total += loss_sum.detach()
            if privatizer is not None:
                positions = None if unit_positions is None else unit_positions[rows]
                privatizer.accumulate_grad_samples(positions, num_units)
            else:
                for total, g in zip(sums, params_grads):
                    if g is not None:
                        total.add_(g)
        loss_total, count = self._sum_over_processes([loss_total, torch.tensor(float(batch), device=labels.device)])
        mean_loss = loss_total / count.clamp(min=1)
        released = (privatizer.release() if privatizer is not None
                     else [s / count.clamp(min=1) for s in self._sum_over_processes(sums)])
        gradient = [torch.zeros_like(p) for p in self._params]  # frozen by a warm-up: zero, not noised
        for i, g in zip(active, released):
            gradient[i] = g
        return gradient, mean_loss

    def _logits(self, model: nn.Module, features: dict[str, Any]) -> torch.Tensor:
        """The model's logits on one micro-batch (without its labels)."""
        return model(**features).logits

    def _example_losses(self, model: nn.Module, features: dict[str, Any], labels: torch.Tensor) -> torch.Tensor:
        """The loss of each example of one micro-batch, shape [b] (its per-sample gradients are clipped)."""
        return per_example_loss(self._logits(model, features), labels)

    def _answer_logits(self, model: nn.Module, features: dict[str, Any],
                       labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A causal LM's next-token logits on one micro-batch and the tokens they predict: [b, w, V] and [b, w]
        (-100 where no answer token is predicted)."""
        return self._logits(model, features)[:, :-1], labels[:, 1:]

    def _anchor_inputs(self) -> list[dict[str, torch.Tensor]]:
        """The anchor rows as micro-batches of ``physical_batch_size`` (collated once, on the device)."""
        if self._anchor_batches is None:
            rows, size = len(self.anchor_rows), self.args.physical_batch_size
            self._anchor_batches = [
                self._prepare_inputs(self.data_collator([self.anchor_rows[i] for i in range(start, min(start + size,
                                                                                                         rows))]))
                for start in range(0, rows, size)]
        return self._anchor_batches

    def _anchor_gradient(self, model: nn.Module) -> list[torch.Tensor | None]:
        """∇A(θ) per trainable parameter (None when frozen), A = μ·mean over the anchor rows of
        :func:`~hf_dpmerge.training.public_anchor.anchor_divergence`: the adapter and the base (its adapter disabled)
        both in evaluation mode, opacus' per-sample hooks off (no public row enters a clipped sum)."""
        active = [i for i, p in enumerate(self._params) if p.requires_grad]
        totals: list[torch.Tensor | None] = [None] * len(self._params)
        hooks = self._grad_sample_module
        was_training = model.training
        model.eval()
        if hooks is not None:
            hooks.disable_hooks()
        try:
            for inputs in self._anchor_inputs():
                labels = inputs["labels"]
                features = {k: v for k, v in inputs.items() if k != "labels"}
                with torch.no_grad(), model.disable_adapter():
                    base_logits, _ = self._answer_logits(model, features, labels)
                with torch.enable_grad():
                    logits, targets = self._answer_logits(model, features, labels)
                    divergence = anchor_divergence(logits, base_logits, targets != IGNORE_INDEX).sum()
                    grads = torch.autograd.grad(self.anchor_lambda * divergence / len(self.anchor_rows),
                                                [self._params[i] for i in active], allow_unused=True)
                for i, g in zip(active, grads):
                    if g is not None:
                        totals[i] = g if totals[i] is None else totals[i] + g
        finally:
            if hooks is not None:
                hooks.enable_hooks()
            model.train(was_training)
        return totals

    def _sum_over_processes(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return sum_over_processes(self.accelerator, tensors)

    # ------------------------------------------------------------------ logging, resuming (saving: ReleaseMixin)
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        accountant = self.dp_state.accountant
        if accountant is not None:
            logs["dp_epsilon"] = round(accountant.epsilon(), 4)
            logs["dp_delta"] = self.delta
        super().log(logs, start_time)

    def hyperparameter_search(self, *args: Any, **kwargs: Any):
        """Refused under DP: every trial trains on the private data and keeping the best one selects the release
        on it, which one run's (ε, δ) does not cover (docs/design.md §10). Without DP: Trainer's search."""
        if self.args.dp:
            raise ValueError(
                "hyperparameter_search is refused under DP: each trial trains on the private training set and "
                "keeping the best trial selects the release on private data, which no privacy record accounts "
                "for (the chosen adapter leaks more than its ε). Choose training hyper-parameters on public data "
                "or with dp=False on data you may disclose; to pick merge settings on private validation data, "
                "use `hf-dpmerge tune` (an accounted private selection)"
            )
        return super().hyperparameter_search(*args, **kwargs)

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any):
        """Train; when resuming, the accountant history, g̃_{t−1}, Σ η² and (at the first step) the
        torch/numpy/python RNG states that dropout draws from continue; the sampling and noise generators continue
        with ``dp_seed`` and are re-seeded from OS entropy without it (``DPState.resume``)."""
        if self.args.dp and not self.args.eval_data_is_public:
            check_no_model_selection(self.callback_handler.callbacks)
        if resume_from_checkpoint is True:  # the last checkpoint a killed run finished writing
            resume_from_checkpoint = str(last_complete_checkpoint(self.args.output_dir))
        if resume_from_checkpoint:
            if missing := missing_checkpoint_files(resume_from_checkpoint):
                raise FileNotFoundError(
                    f"checkpoint {resume_from_checkpoint} lacks {missing}: it is not a complete DPSAMTrainer "
                    "checkpoint (interrupted while being written?); cannot continue the privacy accounting"
                )
            # without dp_seed, fresh sampling and noise after the resume point (shared only by the steps before it)
            fresh_sample_seed = shared_seed(self.accelerator, None) if self.args.dp_seed is None else None
            self.dp_state.resume(resume_from_checkpoint, fresh_sample_seed)
            if self.args.dp:  # DP skips no data on resume, so Trainer does not re-sync the RNG itself
                self.dp_state.rng_checkpoint = mid_epoch_checkpoint(resume_from_checkpoint, self.steps_per_epoch)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
