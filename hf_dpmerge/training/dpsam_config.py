"""``DPSAMConfig``: TrainingArguments for private, sharpness-aware, drift-aligned LoRA fine-tuning."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from transformers import TrainingArguments

from hf_dpmerge.training.dp.accounting import ACCOUNTANTS
from hf_dpmerge.training.dp.privatizer import CLIPPING_MODES
from hf_dpmerge.training.sam import SAM_MODES


@dataclass
class DPSAMConfig(TrainingArguments):
    """Configuration of :class:`~hf_dpmerge.DPSAMTrainer`.

    ``per_device_train_batch_size`` is the *expected* size B_exp of each step's Poisson draw (sample rate
    q = B_exp/N); ``physical_batch_size`` is the micro-batch the draw is split into for memory. Trainer-level
    gradient clipping (``max_grad_norm``) and gradient accumulation over separate draws would break the DP
    analysis, so they are refused when ``dp`` is on; so is every other flag that breaks the guarantee's premises
    (Poisson sampling at a fixed q, per-example sensitivity, whole per-sample gradients), that Poisson sampling
    replaces, or that DPSAMTrainer's step does not implement (:meth:`step_problems`); docs/bad-inputs.md
    lists every TrainingArguments flag.

    ``privacy_unit_column`` (e.g. an author or patient id) makes the guarantee user-level: the units are the
    column's distinct values, each step Poisson-samples *units* and takes all their rows, each unit's summed
    gradient is clipped to C, and q = B_exp/N_units where ``per_device_train_batch_size``·world_size is then
    the expected number of *units* per draw (docs/design.md §9).
    """

    dp: bool = field(
        default=True, metadata={"help": "Train with DP-SGD. False gives a like-for-like non-private baseline."}
    )
    target_epsilon: float | None = field(
        default=8.0, metadata={"help": "ε to calibrate σ for (ignored when noise_multiplier is given)."}
    )
    target_delta: float | None = field(
        default=None, metadata={"help": "δ of the guarantee; default 1/(10·N). Must be < 1/N."}
    )
    allow_large_delta: bool = field(default=False, metadata={"help": "Permit δ ≥ 1/N (a weak guarantee)."})
    noise_multiplier: float | None = field(
        default=None, metadata={"help": "Explicit σ per query; overrides calibration from target_epsilon."}
    )
    epsilon_budget: float | None = field(
        default=None,
        metadata={"help": "Stop before ε exceeds this; defaults to target_epsilon. Useful with an explicit σ."},
    )
    per_sample_max_grad_norm: float = field(default=1.0, metadata={"help": "Per-sample clipping norm C."})
    clipping: str = field(
        default="flat",
        metadata={"help": "'flat': clip each per-sample gradient to C; 'automatic': normalise it, g/(‖g‖+γ), "
                  "sensitivity 1 (no C to tune; per_sample_max_grad_norm is then unused and the record says C = 1; "
                  "docs/design.md §15.4).", "choices": CLIPPING_MODES},
    )
    clipping_gamma: float = field(
        default=0.01, metadata={"help": "Stability constant γ > 0 of automatic clipping, g/(‖g‖+γ)."}
    )
    accountant: str = field(default="prv", metadata={"help": "opacus accountant: 'prv' or 'rdp'."})
    sam_mode: str = field(
        default="dp_sat", metadata={"help": "'none' | 'dp_sat' | 'per_example' | 'two_query'."}
    )
    sam_rho: float = field(default=0.05, metadata={"help": "Sharpness-aware ascent radius ρ."})
    align_lambda: float = field(default=0.05, metadata={"help": "Alignment penalty λ on ‖ΔW‖² (0 disables)."})
    proximal_mu: float = field(
        default=0.0,
        metadata={"help": "FedProx's proximal term (μ/2)·‖θ − θ₀‖² over the trainable parameters, θ₀ their values at "
                  "the first step (in a federation: the round's global adapter); its gradient μ·(θ − θ₀) is "
                  "data-free and added after the noise, like the alignment penalty's (0 disables)."},
    )
    anchor_lambda: float = field(
        default=0.0,
        metadata={"help": "Causal LMs: the public anchor's weight μ, μ·KL(base ‖ adapter) on the base's own answers to "
                  "public prompts of other formats (examples/train_causal_lm.py --anchor_prompts); its gradient "
                  "uses public data and the weights only and is added after the noise (docs/design.md §14.1; "
                  "0 disables)."},
    )
    head_learning_rate: float | None = field(
        default=None,
        metadata={"help": "Learning rate of the task head (peft modules_to_save); default: learning_rate. "
                  "A fresh head needs larger steps than the LoRA factors under DP noise."},
    )
    head_warmup_steps: float = field(
        default=0,
        metadata={"help": "Linear probe, then fine-tune: the first K steps train the task head only (LoRA frozen: "
                  "not clipped, not noised), the rest LoRA and head; one accountant over all max_steps steps. "
                  "An integer K ≥ 1, or a float in [0, 1): that fraction of max_steps, rounded down "
                  "(docs/design.md §15.3)."},
    )
    average_last_steps: int = field(
        default=0,
        metadata={"help": "Release the mean of the last K iterates instead of the last one: post-processing of the "
                  "accounted steps, no privacy cost (docs/design.md §15.7; 0 disables)."},
    )
    physical_batch_size: int = field(default=64, metadata={"help": "Micro-batch size inside one Poisson draw."})
    dp_seed: int | None = field(
        default=None,
        metadata={"help": "Seed of the Poisson-sampling and noise generators; default: fresh OS entropy."},
    )
    privacy_unit_column: str | None = field(
        default=None,
        metadata={"help": "Column whose values are the privacy units (e.g. an author id): user-level DP, "
                  "sampling and clipping per unit; per_device_train_batch_size is then the expected number "
                  "of units per draw. Default: one row is the unit."},
    )
    max_grad_norm: float = field(
        default=0.0, metadata={"help": "Trainer-level clipping of the aggregate; must stay 0 under DP."}
    )
    eval_data_is_public: bool = field(
        default=False,
        metadata={"help": "Declare the evaluation data public, permitting evaluation during training and model "
                  "selection (load_best_model_at_end, early stopping) under DP; the privacy record says so."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dataloader_pin_memory and not torch.accelerator.is_available():
            self.dataloader_pin_memory = False  # pinning needs an accelerator (torch warns and skips it otherwise)
        problems = []
        if self.sam_mode not in SAM_MODES:
            problems.append(f"sam_mode must be one of {SAM_MODES}, got {self.sam_mode!r}")
        if self.head_learning_rate is not None and not (
            math.isfinite(self.head_learning_rate) and self.head_learning_rate > 0
        ):
            problems.append(f"head_learning_rate must be a positive number, got {self.head_learning_rate!r}")
        if not (math.isfinite(self.sam_rho) and self.sam_rho >= 0):
            problems.append(f"sam_rho must be a finite number ≥ 0, got {self.sam_rho}")
        if not (math.isfinite(self.align_lambda) and self.align_lambda >= 0):
            problems.append(f"align_lambda must be a finite number ≥ 0, got {self.align_lambda}")
        if not (math.isfinite(self.proximal_mu) and self.proximal_mu >= 0):
            problems.append(f"proximal_mu must be a finite number ≥ 0, got {self.proximal_mu}")
        if not (math.isfinite(self.anchor_lambda) and self.anchor_lambda >= 0):
            problems.append(f"anchor_lambda must be a finite number ≥ 0, got {self.anchor_lambda}")
        if self.clipping not in CLIPPING_MODES:
            problems.append(f"clipping must be one of {CLIPPING_MODES}, got {self.clipping!r}")
        if not (math.isfinite(self.clipping_gamma) and self.clipping_gamma > 0):
            problems.append(f"clipping_gamma must be a finite number > 0, got {self.clipping_gamma}")
        if not (math.isfinite(self.head_warmup_steps) and self.head_warmup_steps >= 0
                and (self.head_warmup_steps < 1 or float(self.head_warmup_steps).is_integer())):
            problems.append("head_warmup_steps must be an integer ≥ 1 (steps) or a fraction in [0, 1) of max_steps, "
                            f"got {self.head_warmup_steps}")
        if self.average_last_steps < 0:
            problems.append(f"average_last_steps must be ≥ 0 (0: the last iterate), got {self.average_last_steps}")
        if self.physical_batch_size < 1:
            problems.append(f"physical_batch_size must be ≥ 1, got {self.physical_batch_size}")
        if self.dp:
            problems += self._dp_problems() + self.step_problems()
            # Poisson draws are i.i.d., so replaying skipped batches on resume would only desynchronise
            # the restored sampler generator.
            self.ignore_data_skip = True
        if problems:
            raise ValueError("invalid DPSAMConfig: " + "; ".join(problems))

    def head_warmup_step_count(self, total_steps: int) -> int:
        """K, the head-only steps of a run of ``total_steps``: ``head_warmup_steps`` when ≥ 1, else
        ⌊head_warmup_steps · total_steps⌋ (a fraction leaves the LoRA factors at least one step)."""
        if self.head_warmup_steps >= 1:
            return int(self.head_warmup_steps)
        return math.floor(self.head_warmup_steps * total_steps)

    def _dp_problems(self) -> list[str]:
        problems = []
        if self.accountant not in ACCOUNTANTS:
            problems.append(f"accountant must be one of {ACCOUNTANTS}, got {self.accountant!r}")
        if self.noise_multiplier is None and self.target_epsilon is None:
            problems.append("give target_epsilon (to calibrate σ) or noise_multiplier")
        for name in ("target_epsilon", "epsilon_budget"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                problems.append(f"{name} must be a finite number > 0, got {value}")
        if self.target_delta is not None and not (0 < self.target_delta < 1):
            problems.append(f"target_delta must lie in (0, 1), got {self.target_delta}")
        if self.noise_multiplier is not None and not (
            math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0
        ):
            problems.append(f"noise_multiplier must be a finite number > 0, got {self.noise_multiplier}"
                            + (" (σ = 0 adds no noise: that is no DP; train with --dp false instead)"
                               if self.noise_multiplier == 0 else ""))
        if not (math.isfinite(self.per_sample_max_grad_norm) and self.per_sample_max_grad_norm > 0):
            problems.append(f"per_sample_max_grad_norm (C) must be > 0, got {self.per_sample_max_grad_norm}")
        if self.max_grad_norm and self.max_grad_norm > 0:
            problems.append(
                "max_grad_norm > 0 would clip the noisy aggregate gradient and distort DP updates; "
                "set max_grad_norm=0 and use per_sample_max_grad_norm for clipping"
            )
        if self.activation_checkpointing:
            problems.append(
                "activation (gradient) checkpointing is not supported under DP: per-sample gradients need each "
                "layer's activations from the forward pass, which checkpointing discards and recomputes inside "
                "backward; set activation_checkpointing=False (gradient_checkpointing=False) and lower "
                "physical_batch_size to save memory instead"
            )
        if self.push_to_hub and self.hub_strategy != "end":
            problems.append(
                f"hub_strategy={getattr(self.hub_strategy, 'value', self.hub_strategy)!r} pushes during training "
                "(checkpoints with the noise generator "
                "state, training_args.bin with dp_seed, loss logs) under DP; use hub_strategy='end' and push the "
                "release with trainer.push_to_hub()"
            )
        if not self.eval_data_is_public:
            selection = [name for name, on in (
                ("load_best_model_at_end", self.load_best_model_at_end),
                (f"eval_strategy={getattr(self.eval_strategy, 'value', self.eval_strategy)!r}",
                 self.eval_strategy != "no"),
                ("eval_on_start", self.eval_on_start),
            ) if on]
            if selection:
                problems.append(
                    f"{' and '.join(selection)}: evaluating or selecting the model during training on private data "
                    "is not covered by the DP guarantee; set eval_strategy='no' and load_best_model_at_end=False, "
                    "or eval_data_is_public=True if the evaluation data is public (the privacy record says so)"
                )
        if self.privacy_unit_column is not None and self.sam_mode == "per_example":
            problems.append(
                "sam_mode='per_example' ascends per row, which has no per-unit meaning under privacy_unit_column: "
                "use sam_mode 'dp_sat', 'two_query' or 'none' with a privacy unit column"
            )
        problems += [f"{flag}: {why}" for flag, why in self._poisson_loader_problems()]
        if self.auto_find_batch_size:
            problems.append(
                "auto_find_batch_size would halve per_device_train_batch_size (the expected Poisson draw, so the "
                "sample rate q) after an out-of-memory error, while σ and the accountant keep the first q; "
                "lower physical_batch_size (the micro-batch a draw is split into) for memory instead"
            )
        if self.neftune_noise_alpha is not None:
            problems.append(
                "neftune_noise_alpha scales its embedding noise by the padded length of the micro-batch, so one "
                "example's gradient depends on the other examples in its batch, which the per-example sensitivity "
                "bound (clip to C) does not allow; leave neftune_noise_alpha unset under DP"
            )
        if self.torch_compile:
            problems.append(
                "torch_compile: opacus computes per-sample gradients with module hooks, which torch.compile does "
                "not preserve; leave torch_compile=False (and torch_compile_backend/mode unset) under DP"
            )
        if self.use_liger_kernel:
            problems.append(
                "use_liger_kernel replaces model modules with fused Liger kernels that opacus has no per-sample "
                "gradient rule for (and that can bypass the LoRA layers); leave use_liger_kernel=False under DP"
            )
        if self.parallelism_config is not None:
            problems.append(
                "parallelism_config shards the model or its gradients (tensor/context/FSDP parallelism), but DP "
                "needs whole per-sample gradients of every trainable parameter on each process; use plain "
                "multi-process (DDP) launching"
            )
        if self.enable_jit_checkpoint:
            problems.append(
                "enable_jit_checkpoint saves on SIGTERM, possibly between the private gradient and the optimizer "
                "step, so the checkpoint's dp_state.pt (accountant, g̃ₜ₋₁) would be a step ahead of its weights; "
                "use save_strategy='steps' and resume_from_checkpoint=True"
            )
        return problems

    def _poisson_loader_problems(self) -> list[tuple[str, str]]:
        """Flags of Trainer's training loader, which Poisson sampling replaces under DP (the Poisson loader takes
        only ``dataloader_num_workers``): (flag, why) for each non-default value, refused rather than ignored."""
        sampler = "under DP every step's batch is a Poisson draw (sample rate q, the accounting's premise)"
        workers_only = "the Poisson training loader takes only dataloader_num_workers"
        accelerator = self.accelerator_config.to_dict()
        found = [
            ("train_sampling_strategy", self.train_sampling_strategy != "random", f"{sampler}; leave it 'random'"),
            ("data_seed", self.data_seed is not None,
             f"seeds Trainer's sampler, but {sampler} seeded by dp_seed (leave both unset in releases)"),
            ("dataloader_drop_last", self.dataloader_drop_last,
             f"{sampler}, of random size: there is no last batch to drop"),
            ("dataloader_persistent_workers", self.dataloader_persistent_workers, workers_only),
            ("dataloader_prefetch_factor", self.dataloader_prefetch_factor is not None, workers_only),
            ("dataloader_multiprocessing_context", self.dataloader_multiprocessing_context is not None, workers_only),
            ("dataloader_in_order", not self.dataloader_in_order, workers_only),
            *[(f"accelerator_config.{key}", accelerator[key] != default,
               "the Poisson training loader shards each draw over the processes itself (accelerate does not "
               "prepare it); leave the default")
              for key, default in (("split_batches", False), ("dispatch_batches", None), ("even_batches", True),
                                   ("use_seedable_sampler", True))],
        ]
        return [(flag, why) for flag, on, why in found if on]

    def step_problems(self) -> list[str]:
        """Flags whose stock meaning DPSAMTrainer's own training step does not implement, private or not (it
        computes per-example losses and sets ``p.grad`` itself, outside ``Trainer.training_step``).

        Refused under DP; with ``dp=False`` DPSAMTrainer keeps Trainer's behaviour for them (it ignores them)
        and ``examples/train_glue.py`` refuses them instead."""
        problems = []
        if self.fp16 or self.bf16:
            problems.append(
                "fp16/bf16 mixed precision is not supported: DPSAMTrainer's step takes (per-sample) gradients "
                "outside accelerator.backward, so the loss scaler would unscale gradients it never scaled; "
                "set fp16=False and bf16=False (--fp16 false --bf16 false)"
            )
        if self.gradient_accumulation_steps != 1:
            problems.append(
                "gradient_accumulation_steps must be 1: DPSAMTrainer's step sets the gradient of one draw (an "
                "accumulation would keep only the last draw, and under DP separate Poisson draws break the "
                "accounting); raise per_device_train_batch_size (the expected draw) and set "
                "physical_batch_size for memory instead"
            )
        if self.label_smoothing_factor != 0:
            problems.append(
                "label_smoothing_factor: DPSAMTrainer's step takes plain per-example losses "
                "(modeling/per_example_loss.py), without label smoothing; set label_smoothing_factor=0"
            )
        if not self.average_tokens_across_devices:
            problems.append(
                "average_tokens_across_devices=False: DPSAMTrainer's loss is always the mean of per-example "
                "losses (each example its own token mean), never a token average; leave the default"
            )
        optimizer = getattr(self.optim, "value", self.optim)
        if optimizer in ("lomo", "adalomo") or optimizer.endswith("_layerwise") or optimizer.startswith(
            "schedule_free"
        ):
            problems.append(
                f"optim={optimizer!r} updates inside the backward pass (lomo, adalomo, *_layerwise) or needs "
                "Trainer's optimizer.train() in the step (schedule_free_*), while DPSAMTrainer's step sets p.grad "
                "to the (privatised) gradient for a plain optimizer.step(); use e.g. adamw_torch, sgd or adafactor"
            )
        if self.torch_empty_cache_steps is not None:
            problems.append(
                "torch_empty_cache_steps: DPSAMTrainer's step does not clear the device cache; lower "
                "physical_batch_size to save memory instead"
            )
        ddp = [name for name in ("ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_static_graph")
               if getattr(self, name) is not None]
        if ddp:
            problems.append(
                f"{', '.join(ddp)}: DPSAMTrainer's step bypasses DistributedDataParallel's forward and gradient "
                "reducer (it all-reduces the clipped sums itself), so these do nothing; leave them unset"
            )
        return problems
