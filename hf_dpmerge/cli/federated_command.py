"""Federated DP fine-tuning on Flower: clients train LoRA adapters with DPSAMTrainer, the server aggregates.

K clients hold disjoint shards of a task's training split. Each round every client is sampled with probability
--client_sample_rate; a sampled client runs --local_steps DP-SGD steps from the global adapter and sends back its
LoRA factors and head; the server (--server_strategy fedavg | fedprox | fedadam) aggregates them (--aggregation)
and, with --client_noise_multiplier z, adds client-level DP: each update clipped to --client_clip_norm S, N(0, z²S²)
added to the sum. Reported (federated_privacy.json, dp_privacy.json): each client's example-level (ε, δ) and, with
server DP, the client-level (ε, δ) (δ = 1/(100·K) by default). See docs/federated.md and docs/design.md §12.
Runs in Flower's simulation engine (the ``federated`` extra). Example::

    hf-dpmerge federated --task rotten_tomatoes --num_clients 4 --rounds 4 --local_steps 10 --batch_size 64
    hf-dpmerge federated --client_noise_multiplier 1.0 --client_clip_norm 0.05 --output_dir runs/fed-dp
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
from dataclasses import dataclass
from typing import Any

from hf_dpmerge.cli.dataclass_help import add_dataclass_help

ADD_HELP = False  # -h/--help prints the dataclass parser's help
# flags of TaskArguments / LoraArguments the federation does not implement: refused when set
UNSUPPORTED = {"dataset_path": "the federation shards a packaged task's training split",
               "lora_freeze_a": "clients train both LoRA factors", "lora_a_seed": "clients train both LoRA factors"}


def _as_training(name: str, default: Any, help_text: str | None = None) -> Any:
    """A field that means what ``DPSAMConfig.<name>`` means: its help (unless ``help_text``), this command's default."""
    from hf_dpmerge.training.dpsam_config import DPSAMConfig  # torch: only when the flags are parsed

    metadata = dict(next(f for f in dataclasses.fields(DPSAMConfig) if f.name == name).metadata)
    if help_text:
        metadata["help"] = help_text
    return dataclasses.field(default=default, metadata=metadata)


def _flag(default: Any, help_text: str, **metadata: Any) -> Any:
    return dataclasses.field(default=default, metadata={"help": help_text, **metadata})


def federated_arguments() -> type:
    """The federation's flags as a dataclass (with :class:`TaskArguments` and :class:`LoraArguments`, what
    ``HfArgumentParser`` parses); the client's DP-SGD flags share ``DPSAMConfig``'s fields."""

    from hf_dpmerge.federated.aggregation import AGGREGATIONS, DEFAULT_DARE_DENSITY, DEFAULT_TIES_DENSITY
    from hf_dpmerge.federated.strategy import DEFAULT_SERVER_ETA, DEFAULT_SERVER_TAU, SERVER_STRATEGIES

    @dataclass
    class FederatedArguments:
        output_dir: str = _flag("runs/federated", "Where adapter/, encoder_adapter/, eval_metrics.json and "
                                "federated_privacy.json are written.")
        overwrite: bool = _flag(False, "Replace a global adapter already released there.")
        num_clients: int = _flag(4, "K, clients with disjoint shards.")
        rounds: int = _flag(4, "Federated rounds.")
        local_steps: int = _flag(10, "DP-SGD steps per client per round.")
        batch_size: int = _flag(64, "Expected Poisson batch per client step.")
        physical_batch_size: int = _as_training("physical_batch_size", 64)
        learning_rate: float = _as_training("learning_rate", 2e-3, "Learning rate of the LoRA factors.")
        head_learning_rate: float = _as_training("head_learning_rate", 2e-2, "Learning rate of the task head.")
        per_sample_max_grad_norm: float = _as_training("per_sample_max_grad_norm", 1.0)
        target_epsilon: float = _as_training("target_epsilon", 8.0, "Each client's example-level ε over ALL rounds "
                                             "(σ calibrated for rounds·local_steps steps).")
        noise_multiplier: float | None = _as_training("noise_multiplier", None)
        target_delta: float | None = _as_training("target_delta", None, "Example-level δ; default 1/(10·N_k) per "
                                                  "client.")
        accountant: str = _as_training("accountant", "prv")
        sam_mode: str = _as_training("sam_mode", "dp_sat")
        sam_rho: float = _as_training("sam_rho", 0.05)
        align_lambda: float = _as_training("align_lambda", 0.05)
        max_eval_samples: int | None = _flag(None, "Evaluate on a seeded stratified subset of this size.")
        server_strategy: str = _flag("fedavg", "Flower's strategy: fedavg; fedprox (each client adds "
                                     "(μ/2)·‖θ − θ_global‖², --proximal_mu); fedadam (Flower's server Adam step "
                                     "on the FedAvg mean, the noised mean under client-level DP: --aggregation "
                                     "fedavg).",
                                     choices=tuple(SERVER_STRATEGIES))
        proximal_mu: float = _flag(0.0, "μ of fedprox's proximal term (data-free: added after the noise).")
        server_eta: float = _flag(DEFAULT_SERVER_ETA, "η, fedadam's server learning rate.")
        server_tau: float = _flag(DEFAULT_SERVER_TAU, "τ, fedadam's adaptivity (added to √v).")
        aggregation: str = _flag("fedavg", "fedavg: Flower's weighted mean; task_arithmetic: θ + λ·mean update; "
                                 "dp_aware: SURE-denoised updates, random-effects weights; ties: θ + λ·TIES of the "
                                 "updates (not under client-level DP); dare: θ + λ·mean of the updates, each "
                                 "coordinate kept with probability --dare_density and rescaled.", choices=AGGREGATIONS)
        ties_density: float = _flag(DEFAULT_TIES_DENSITY, "Share of each update TIES keeps (largest magnitudes).")
        dare_density: float = _flag(DEFAULT_DARE_DENSITY, "Probability DARE keeps a coordinate of an update.")
        server_learning_rate: float = _flag(1.0, "λ of task_arithmetic and dp_aware.")
        client_sample_rate: float = _flag(1.0, "q, Poisson client sampling.")
        client_noise_multiplier: float | None = _flag(None, "z: turn on client-level DP at the server (noise "
                                                      "N(0, z²S²) on the clipped sum).")
        client_clip_norm: float = _flag(0.1, "S, L2 clip of a whole client update.")
        client_delta: float | None = _flag(None, "Client-level δ; default 1/(100·K), so that K·δ = 1%%.")
        allow_large_client_delta: bool = _flag(False, "Permit a client-level δ ≥ 1/K (a weak guarantee; the "
                                               "record says so).")
        concurrent_clients: int = _flag(1, "Clients trained at once (CPUs used).")
        seed: int = _flag(0, "Seed of the shards, the initial adapter and training.")
        dp_seed: int | None = _as_training("dp_seed", None)

    return FederatedArguments


def argument_parser() -> argparse.ArgumentParser:
    """``hf-dpmerge federated``'s flags: :class:`TaskArguments`, :class:`LoraArguments` and the federation's."""
    from transformers import HfArgumentParser

    from hf_dpmerge.scripts.arguments import LoraArguments, TaskArguments

    parser = HfArgumentParser((TaskArguments, LoraArguments, federated_arguments()))
    for action in parser._actions:
        if action.dest in UNSUPPORTED:
            action.help = argparse.SUPPRESS  # refused by parse_arguments, so not offered
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    add_dataclass_help(parser, argument_parser, __doc__)
    parser.set_defaults(accepts_extra=True)


def parse_arguments(argv: list[str]) -> tuple[Any, Any, Any]:
    """(task, lora, federation) flags of ``argv``; a flag the federation does not implement is refused."""
    parser = argument_parser()
    task, lora, federation = parser.parse_args_into_dataclasses(args=argv)
    given, defaults = {**vars(task), **vars(lora)}, vars(parser.parse_args([]))
    for name, why in UNSUPPORTED.items():
        if given[name] != defaults[name]:
            raise ValueError(f"hf-dpmerge federated does not support --{name} ({why}): leave it out")
    return task, lora, federation


def require_flower() -> None:
    """Refuse, naming the extra to install, when Flower or its simulation engine (Ray) is missing."""
    missing = [name for name in ("flwr", "ray") if importlib.util.find_spec(name) is None]
    if missing:
        raise ValueError(f"hf-dpmerge federated needs {' and '.join(missing)}: pip install 'hf_dpmerge[federated]'")


def run(args: argparse.Namespace) -> int:
    require_flower()
    from hf_dpmerge.federated.client_level_dp import ClientLevelDP
    from hf_dpmerge.federated.federation import FederatedSetup
    from hf_dpmerge.federated.simulation import FEDERATED_RECORD_NAME, ServerSettings, run_federated

    task, lora, fed = parse_arguments(args.extra)
    base, task = task.model_source(), task.with_pooling()
    setup = FederatedSetup(
        task=task.task, base=base, num_clients=fed.num_clients, rounds=fed.rounds,
        local_steps=fed.local_steps, batch_size=fed.batch_size, physical_batch_size=fed.physical_batch_size,
        learning_rate=fed.learning_rate, head_learning_rate=fed.head_learning_rate,
        max_grad_norm=fed.per_sample_max_grad_norm, target_epsilon=fed.target_epsilon,
        noise_multiplier=fed.noise_multiplier, target_delta=fed.target_delta, accountant=fed.accountant,
        sam_mode=fed.sam_mode, sam_rho=fed.sam_rho, align_lambda=fed.align_lambda, lora_r=lora.lora_r,
        lora_alpha=lora.lora_alpha, lora_target_modules=tuple(lora.lora_target_modules.split(",")),
        lora_layers=lora.lora_layers, **lora.trainer_options(), classifier_pooling=task.classifier_pooling,
        max_length=task.max_length,
        max_train_samples=task.max_train_samples, max_eval_samples=fed.max_eval_samples, seed=fed.seed,
        dp_seed=fed.dp_seed,
    )
    client_dp = None
    if fed.client_noise_multiplier is not None:
        client_dp = ClientLevelDP(
            noise_multiplier=fed.client_noise_multiplier, clip_norm=fed.client_clip_norm,
            sample_rate=fed.client_sample_rate, num_clients=fed.num_clients, accountant=fed.accountant,
            target_delta=fed.client_delta, allow_large_delta=fed.allow_large_client_delta,
        )
    server = ServerSettings(
        aggregation=fed.aggregation, server_learning_rate=fed.server_learning_rate,
        client_sample_rate=fed.client_sample_rate, client_dp=client_dp, concurrent_clients=fed.concurrent_clients,
        ties_density=fed.ties_density, dare_density=fed.dare_density, server_strategy=fed.server_strategy,
        proximal_mu=fed.proximal_mu, server_eta=fed.server_eta, server_tau=fed.server_tau,
    )
    summary = run_federated(setup, server, fed.output_dir, overwrite=fed.overwrite)
    print(format_guarantee(summary))
    print(f"saved {fed.output_dir}/adapter and {fed.output_dir}/{FEDERATED_RECORD_NAME}")
    return 0


def format_guarantee(summary: dict) -> str:
    """The per-round metric and both guarantees, as printed by the command."""
    metric = next(k for k in summary["history"][0] if k not in ("round", "sampled_clients"))
    lines = [f"round  clients  validation {metric}"]
    lines += [f"{h['round']:>5}  {','.join(map(str, h['sampled_clients'])) or '-':>7}  {h[metric]:.4f}"
              for h in summary["history"]]
    lines.append(f"final global model, test {metric}: {summary['test'][metric]:.4f}")
    example = summary["released"]["example_level"]
    steps = ", ".join(str(c["steps"]) for c in summary["guarantee"]["example_level"]["clients"])
    lines.append(f"example level: (ε = {example['epsilon']:.3g}, δ = {example['delta']:.3g}) per example; "
                 f"steps accounted: {example['steps_accounted']} (steps per client: {steps})")
    client = summary["released"]["client_level"]
    lines.append("client level: none (no server-side DP; pass --client_noise_multiplier)" if client is None else
                 f"client level: (ε = {client['epsilon']:.3g}, δ = {client['delta']:.3g}) per client added or "
                 f"removed, ε = {client['epsilon_replace_one']:.3g} per client replaced "
                 f"(z = {client['noise_multiplier']:g}, S = {client['clip_norm']:g}, q = {client['sample_rate']:g}, "
                 f"{client['rounds']} rounds)")
    return "\n".join(lines)
