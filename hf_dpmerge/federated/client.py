"""The Flower ClientApp: one round of a client is one DPSAMTrainer run on its own shard from the global state.

The reply carries the trained LoRA factors and head (an ``ArrayRecord``), ``num-examples`` and the run's
privacy record (``dp_privacy.json``'s fields, as JSON), from which the server composes the client's
example-level guarantee over rounds (:mod:`hf_dpmerge.federated.guarantee`).
"""

from __future__ import annotations

import json
import tempfile

from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from transformers import DataCollatorWithPadding

from hf_dpmerge.federated.federation import (
    FederatedSetup,
    client_shard,
    load_trainable_state,
    task_data,
    trainable_state,
)
from hf_dpmerge.training.cached_prefix import dp_trainer
from hf_dpmerge.training.dpsam_config import DPSAMConfig

PRIVACY_RECORD_KEY = "privacy-record"


def train_client(setup: FederatedSetup, client: int, global_state: dict, server_round: int,
                 proximal_mu: float = 0.0) -> RecordDict:
    """Train client ``client`` for one round from ``global_state`` (with FedProx's term at ``proximal_mu``, the
    round config's ``proximal-mu``); its reply content."""
    _, spec, tokenizer = task_data(setup)
    shard = client_shard(setup, client)
    model = setup.model(spec)
    load_trainable_state(model, global_state)
    dp_seed = None if setup.dp_seed is None else setup.dp_seed + 1000 * server_round + 2 * client
    with tempfile.TemporaryDirectory(prefix=f"hf_dpmerge_client{client}_") as scratch:
        config = DPSAMConfig(
            output_dir=scratch,
            per_device_train_batch_size=setup.batch_size,
            physical_batch_size=setup.physical_batch_size,
            max_steps=setup.local_steps,
            learning_rate=setup.learning_rate,
            head_learning_rate=setup.head_learning_rate,
            lr_scheduler_type="constant",  # Σ η² = steps·lr², as planned_client_records states it
            weight_decay=0.0,
            per_sample_max_grad_norm=setup.max_grad_norm,
            noise_multiplier=setup.client_noise_multiplier(len(shard)),
            target_epsilon=None,
            epsilon_budget=setup.target_epsilon,
            target_delta=setup.target_delta,
            accountant=setup.accountant,
            sam_mode=setup.sam_mode,
            sam_rho=setup.sam_rho,
            align_lambda=setup.align_lambda,
            proximal_mu=proximal_mu,
            dp_seed=dp_seed,
            seed=setup.seed + server_round,
            save_strategy="no",
            report_to="none",
            logging_steps=max(1, setup.local_steps),
            disable_tqdm=True,
        )
        trainer = dp_trainer(model, config, train_dataset=shard, data_collator=DataCollatorWithPadding(tokenizer),
                             cache_prefix=setup.cache_prefix, cache_dtype=setup.cache_dtype,
                             prefix_cache_dir=setup.prefix_cache_dir)
        result = trainer.train()
        record = trainer.privacy_record()
    record.task = setup.task
    return RecordDict({
        "arrays": ArrayRecord(trainable_state(model)),
        "metrics": MetricRecord({"num-examples": len(shard), "train-loss": float(result.training_loss),
                                 "client": client}),
        "privacy": ConfigRecord({PRIVACY_RECORD_KEY: json.dumps(record.to_dict(), allow_nan=True)}),
    })


def build_client_app(setup: FederatedSetup) -> ClientApp:
    """A ClientApp whose node ``partition-id`` (set by the simulation engine) names its shard."""
    app = ClientApp()

    @app.train()
    def train(message: Message, context: Context) -> Message:
        client = int(context.node_config["partition-id"])
        config = message.content["config"]
        global_state = message.content["arrays"].to_torch_state_dict()
        content = train_client(setup, client, global_state, int(config["server-round"]),
                               float(config.get("proximal-mu", 0.0)))
        return Message(content=content, reply_to=message)

    return app
