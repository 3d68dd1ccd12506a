"""Federated DP fine-tuning on Flower: clients train LoRA adapters with DPSAMTrainer (example-level DP on
their own shard), the server aggregates with FedAvg or hf_dpmerge's merge kernels and optionally adds
client-level (user-level) DP; both guarantees are accounted with opacus' accountants.

Run it with ``hf-dpmerge federated`` (:mod:`hf_dpmerge.cli.federated_command`); design: docs/design.md §12.
"""
