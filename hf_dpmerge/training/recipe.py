"""The DP training recipe tuned for the packaged all-MiniLM-L6-v2 (README "The task model and the DP defaults").

Chosen on rotten_tomatoes' validation split at ε = 8: Poisson batches of expected size 256, 40 steps, a
constant AdamW learning rate of 2·10⁻³ for the LoRA factors and 2·10⁻² for the fresh task head, C = 1.
Command-line flags of ``DPSAMConfig``; ``examples/train_glue.py`` and ``hf-dpmerge audit`` put them first, so
any later flag overrides them.
"""

DP_RECIPE: list[str] = [
    "--per_device_train_batch_size", "256",
    "--physical_batch_size", "64",
    "--max_steps", "40",
    "--learning_rate", "2e-3",
    "--head_learning_rate", "2e-2",
    "--lr_scheduler_type", "constant",
    "--weight_decay", "0.0",
    "--per_sample_max_grad_norm", "1.0",
    "--target_epsilon", "8",
    "--logging_steps", "5",
    "--save_strategy", "no",
    "--report_to", "none",
    "--seed", "0",
]

HEAD_ONLY_RECIPE: list[str] = [
    "--per_device_train_batch_size", "1024",
    "--physical_batch_size", "1024",
    "--max_steps", "1000",
    "--learning_rate", "1e-2",
    "--head_learning_rate", "1e-2",
    "--sam_mode", "none",
    "--align_lambda", "0",
    "--logging_steps", "250",
]
