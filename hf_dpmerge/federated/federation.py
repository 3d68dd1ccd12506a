"""What the server and every client share: the task, the base, the client recipe and each client's shard."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import datasets
import torch
from peft import PeftModel
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from hf_dpmerge.data import load_task, tokenize_task
from hf_dpmerge.data.tasks import TaskSpec
from hf_dpmerge.training.dp.accounting import calibrate_noise_multiplier, resolve_delta
from hf_dpmerge.training.lora_classifier import lora_sequence_classifier
from hf_dpmerge.training.sam import queries_per_step


@dataclass(frozen=True)
class FederatedSetup:
    """The federation: ``num_clients`` clients hold disjoint shards of ``task``'s training split; each
    round a sampled client runs ``local_steps`` DP-SGD steps of expected batch ``batch_size`` (Poisson) from
    the global adapter. ``target_epsilon`` is each client's example-level budget over ALL ``rounds``
    (σ is calibrated for rounds·local_steps steps), unless ``noise_multiplier`` fixes σ."""

    task: str
    base: str
    num_clients: int
    rounds: int
    local_steps: int
    batch_size: int
    physical_batch_size: int = 64
    learning_rate: float = 2e-3
    head_learning_rate: float | None = 2e-2
    max_grad_norm: float = 1.0
    target_epsilon: float | None = 8.0
    noise_multiplier: float | None = None
    target_delta: float | None = None
    accountant: str = "prv"
    sam_mode: str = "dp_sat"
    sam_rho: float = 0.05
    align_lambda: float = 0.05
    lora_r: int = 8
    lora_alpha: int = 16
    lora_target_modules: tuple[str, ...] = ("query", "value")
    lora_layers: str = "top_half"
    cache_prefix: str = "auto"
    cache_dtype: str = "float16"
    prefix_cache_dir: str | None = None  # a client's frozen prefix is the same every round: cached once on disk
    classifier_pooling: str | None = None
    max_length: int = 64
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    seed: int = 0
    dp_seed: int | None = None

    def __post_init__(self) -> None:
        problems = [
            f"--{name} must be ≥ 1, got {getattr(self, name)}"
            for name in ("num_clients", "rounds", "local_steps", "batch_size", "physical_batch_size")
            if getattr(self, name) < 1
        ]
        if self.noise_multiplier is None and self.target_epsilon is None:
            problems.append("give --target_epsilon (each client's budget over all rounds) or --noise_multiplier")
        if problems:
            raise ValueError("; ".join(problems))

    def model(self, spec: TaskSpec) -> PeftModel:
        """The LoRA classifier every party builds; its trainable tensors are the federated state."""
        torch.manual_seed(self.seed)
        return lora_sequence_classifier(
            self.base, spec, r=self.lora_r, alpha=self.lora_alpha, target_modules=self.lora_target_modules,
            layers=self.lora_layers, classifier_pooling=self.classifier_pooling,
        )

    def client_noise_multiplier(self, num_samples: int) -> float:
        """σ (per query) of a client with ``num_samples`` examples: explicit, or calibrated so that a client sampled
        in every round (rounds·local_steps steps at q = batch_size/N, σ_eff = σ/√k for the k queries a step of
        ``sam_mode`` makes) spends at most ``target_epsilon``."""
        if self.noise_multiplier is not None:
            return self.noise_multiplier
        return calibrate_noise_multiplier(
            target_epsilon=self.target_epsilon, target_delta=resolve_delta(self.target_delta, num_samples),
            sample_rate=self.batch_size / num_samples, steps=self.rounds * self.local_steps, accountant=self.accountant,
            queries_per_step=queries_per_step(self.sam_mode),
        )


@lru_cache(maxsize=4)
def task_data(setup: FederatedSetup) -> tuple[datasets.DatasetDict, TaskSpec, PreTrainedTokenizerBase]:
    """The task's tokenized splits (train, validation, test), its spec and the base's tokenizer."""
    splits, spec = load_task(
        setup.task, max_train_samples=setup.max_train_samples, max_eval_samples=setup.max_eval_samples
    )
    tokenizer = AutoTokenizer.from_pretrained(setup.base)
    return tokenize_task(splits, spec, tokenizer, max_length=setup.max_length), spec, tokenizer


def client_shard(setup: FederatedSetup, client: int) -> datasets.Dataset:
    """Client ``client``'s disjoint shard: a seeded shuffle of the training split cut into K contiguous parts."""
    if not 0 <= client < setup.num_clients:
        raise ValueError(f"client {client} is outside 0..{setup.num_clients - 1}")
    train = task_data(setup)[0]["train"]
    if len(train) < setup.num_clients:
        raise ValueError(f"{len(train)} training examples cannot be split over {setup.num_clients} clients")
    shard = train.shuffle(seed=setup.seed).shard(num_shards=setup.num_clients, index=client, contiguous=True)
    if setup.batch_size > len(shard):
        raise ValueError(
            f"client {client} holds {len(shard)} examples, fewer than --batch_size {setup.batch_size}: "
            "lower --batch_size or --num_clients"
        )
    return shard


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The federated state: every trainable tensor (LoRA factors and the task head), detached copies."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def load_trainable_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy ``state`` into ``model``'s trainable tensors; refuses a state with other names or shapes."""
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    if set(params) != set(state):
        raise ValueError(f"global state and model differ in tensors {sorted(set(params) ^ set(state))}")
    with torch.no_grad():
        for name, tensor in state.items():
            if params[name].shape != tensor.shape:
                raise ValueError(
                    f"{name}: global state has shape {tuple(tensor.shape)}, model {tuple(params[name].shape)}"
                )
            params[name].copy_(tensor)


