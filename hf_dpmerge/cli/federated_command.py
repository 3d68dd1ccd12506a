"""Federated DP fine-tuning on Flower: clients train LoRA adapters with DPSAMTrainer, the server aggregates.

K clients hold disjoint shards of a task's training split. Each round every client is sampled with
probability --client_sample_rate (Poisson); a sampled client runs --local_steps DP-SGD steps (Poisson
batches of expected size --batch_size) from the global adapter on its own shard and sends back its LoRA
factors and head. The server aggregates them (--aggregation fedavg | task_arithmetic | dp_aware) and, with
--client_noise_multiplier, adds client-level DP: each client's update is clipped to --client_clip_norm S,
N(0, z²S²) is added to the sum, which is divided by the expected number of sampled clients.
Client-level δ defaults to 1/(100·K); δ ≥ 1/K needs --allow_large_client_delta.

Reported (federated_privacy.json, the adapter's dp_privacy.json, and printed): each client's example-level
(ε, δ) over all its rounds (one accountant over all its DP-SGD steps; the global model: the maximum over
clients, shards being disjoint) and, with server DP, the client-level (ε, δ) of the rounds at (z, q):
add/remove-one client's whole data, and its ε under replace-one client at the same δ.

Example::

    hf-dpmerge federated --task rotten_tomatoes --num_clients 4 --rounds 4 --local_steps 10 --batch_size 64
    hf-dpmerge federated --client_noise_multiplier 1.0 --client_clip_norm 0.05 --output_dir runs/fed-dp

The simulation runs in Flower's engine (Ray backend, installed with hf_dpmerge's ``federated`` extra).
"""

from __future__ import annotations

import argparse
import importlib.util

from hf_dpmerge.scripts.arguments import LoraArguments, TaskArguments, add_dataclass_flag


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--task", default="rotten_tomatoes", help="task whose training split is sharded")
    parser.add_argument("--model_name_or_path", help="base sequence-classification model (default: the packaged "
                        "all-MiniLM-L6-v2; pass runs/base to share the base of train_glue.py's adapters)")
    parser.add_argument("--output_dir", default="runs/federated", help="where adapter/, encoder_adapter/, "
                        "eval_metrics.json and federated_privacy.json are written (default: runs/federated)")
    parser.add_argument("--overwrite", action="store_true", help="replace a global adapter already released there")
    parser.add_argument("--num_clients", type=int, default=4, help="K, clients with disjoint shards (default: 4)")
    parser.add_argument("--rounds", type=int, default=4, help="federated rounds (default: 4)")
    parser.add_argument("--local_steps", type=int, default=10, help="DP-SGD steps per client per round (default: 10)")
    parser.add_argument("--batch_size", type=int, default=64, 
                        help="expected Poisson batch per client step (default: 64)")
    parser.add_argument("--physical_batch_size", type=int, default=64, help="micro-batch for memory (default: 64)")
    parser.add_argument("--learning_rate", type=float, default=2e-3, help="LoRA learning rate (default: 2e-3)")
    parser.add_argument("--head_learning_rate", type=float, default=2e-2, 
                        help="task head learning rate (default: 2e-2)")
    parser.add_argument("--per_sample_max_grad_norm", type=float, default=1.0, help="per-example clip C (default: 1)")
    parser.add_argument("--target_epsilon", type=float, default=8.0,
                        help="each client's example-level ε over ALL rounds (σ calibrated for rounds·local_steps)")
    parser.add_argument("--noise_multiplier", type=float, help="explicit client σ (overrides --target_epsilon)")
    parser.add_argument("--target_delta", type=float, help="example-level δ (default: 1/(10·N_k) per client)")
    parser.add_argument("--accountant", choices=("prv", "rdp"), default="prv", help="opacus accountant (both levels)")
    parser.add_argument("--sam_mode", default="dp_sat", 
                        help="none | dp_sat | per_example | two_query (default: dp_sat)")
    parser.add_argument("--sam_rho", type=float, default=0.05, help="sharpness-aware ascent radius ρ (default: 0.05)")
    parser.add_argument("--align_lambda", type=float, default=0.05,
                        help="alignment penalty λ on ‖ΔW‖², 0 disables (default: 0.05)")
    for name in ("lora_r", "lora_alpha", "lora_target_modules", "lora_layers"):
        add_dataclass_flag(parser, LoraArguments, name)
    for name in ("classifier_pooling", "max_length", "max_train_samples"):
        add_dataclass_flag(parser, TaskArguments, name)
    parser.add_argument("--max_eval_samples", type=int, help="evaluate on a seeded stratified subset")
    parser.add_argument("--aggregation", choices=("fedavg", "task_arithmetic", "dp_aware"), default="fedavg",
                        help="fedavg: Flower's weighted mean; task_arithmetic: θ + λ·mean update; dp_aware: "
                        "SURE-denoised updates, random-effects weights (default: fedavg)")
    parser.add_argument("--server_learning_rate", type=float, default=1.0, help="λ (default: 1)")
    parser.add_argument("--client_sample_rate", type=float, default=1.0, help="q, Poisson client sampling (default: 1)")
    parser.add_argument("--client_noise_multiplier", type=float,
                        help="z: turn on client-level DP at the server (noise N(0, z²S²) on the clipped sum)")
    parser.add_argument("--client_clip_norm", type=float, default=0.1, help="S, L2 clip of a whole client update")
    parser.add_argument("--client_delta", type=float, help="client-level δ (default: 1/(100·K), so that K·δ = 1%%)")
    parser.add_argument("--allow_large_client_delta", action="store_true",
                        help="permit a client-level δ ≥ 1/K (a weak guarantee; the record says so)")
    parser.add_argument("--concurrent_clients", type=int, default=1, help="clients trained at once (CPUs used)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the shards, the initial adapter and training")
    parser.add_argument("--dp_seed", type=int, help="seed the DP noise and sampling (tests only; default: OS entropy)")


def require_flower() -> None:
    """Refuse, naming the extra to install, when Flower or its simulation engine (Ray) is missing."""
    missing = [name for name in ("flwr", "ray") if importlib.util.find_spec(name) is None]
    if missing:
        raise ValueError(f"hf-dpmerge federated needs {' and '.join(missing)}: pip install 'hf_dpmerge[federated]'")


def run(args: argparse.Namespace) -> int:
    require_flower()
    from hf_dpmerge.data import default_model_path
    from hf_dpmerge.federated.client_level_dp import ClientLevelDP
    from hf_dpmerge.federated.federation import FederatedSetup
    from hf_dpmerge.federated.simulation import (
        FEDERATED_RECORD_NAME,
        ServerSettings,
        run_federated,
    )
    from hf_dpmerge.modeling import default_classifier_pooling

    base = args.model_name_or_path or str(default_model_path())
    setup = FederatedSetup(
        task=args.task, base=base, num_clients=args.num_clients, rounds=args.rounds,
        local_steps=args.local_steps, batch_size=args.batch_size, physical_batch_size=args.physical_batch_size,
        learning_rate=args.learning_rate, head_learning_rate=args.head_learning_rate,
        max_grad_norm=args.per_sample_max_grad_norm, target_epsilon=args.target_epsilon,
        noise_multiplier=args.noise_multiplier, target_delta=args.target_delta, accountant=args.accountant,
        sam_mode=args.sam_mode, sam_rho=args.sam_rho, align_lambda=args.align_lambda, lora_r=args.lora_r,
        lora_alpha=args.lora_alpha, lora_target_modules=tuple(args.lora_target_modules.split(",")),
        lora_layers=args.lora_layers,
        classifier_pooling=args.classifier_pooling or default_classifier_pooling(base),
        max_length=args.max_length, max_train_samples=args.max_train_samples,
        max_eval_samples=args.max_eval_samples, seed=args.seed, dp_seed=args.dp_seed,
    )
    client_dp = None
    if args.client_noise_multiplier is not None:
        client_dp = ClientLevelDP(
            noise_multiplier=args.client_noise_multiplier, clip_norm=args.client_clip_norm,
            sample_rate=args.client_sample_rate, num_clients=args.num_clients, accountant=args.accountant,
            target_delta=args.client_delta, allow_large_delta=args.allow_large_client_delta,
        )
    server = ServerSettings(
        aggregation=args.aggregation, server_learning_rate=args.server_learning_rate,
        client_sample_rate=args.client_sample_rate, client_dp=client_dp, concurrent_clients=args.concurrent_clients,
    )
    summary = run_federated(setup, server, args.output_dir, overwrite=args.overwrite)
    print(format_guarantee(summary))
    print(f"saved {args.output_dir}/adapter and {args.output_dir}/{FEDERATED_RECORD_NAME}")
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
