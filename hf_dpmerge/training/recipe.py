"""The packaged DP training recipes: ``DPSAMConfig`` flags that ``examples/train_glue.py`` and ``hf-dpmerge audit``
put first, so any later flag overrides them.

- ``DP_RECIPE``: every DP run's base, tuned for the packaged all-MiniLM-L6-v2 (rotten_tomatoes, ε = 8).
- ``LORA_RECIPE`` (on top, for LoRA adapters): FFA-LoRA with the first quarter of the steps on the head alone
  (docs/design.md §15.2, §15.3, §15.5; benchmarks/reports/recipe/RECIPES.md).
- ``LPFT_RECIPE`` (on top of both: the training script's LoRA default): private LP-FT, the head at 0.75·ε, then
  FFA-LoRA on the top two layers from the cached prefix (docs/design.md §15.6; benchmarks/reports/lpft/LPFT.md).
- ``ONE_PHASE_RECIPE`` undoes ``LPFT_RECIPE`` (``--lora_recipe one_phase``): the one-phase FFA-LoRA recipe.
- ``HEAD_ONLY_RECIPE`` (on top of ``DP_RECIPE``): the head-only floor, ``--train_lora false`` (docs/design.md §15.1).
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

LORA_RECIPE: list[str] = [  # on top of DP_RECIPE (later flags win): LoRA adapters, --train_lora true
    "--lora_freeze_a", "true",
    "--head_warmup_steps", "0.25",
]

# phase 2 starts at the phase-1 model (B = 0), so the adapter starts where the private head ends
LPFT_RECIPE: list[str] = [  # on top of DP_RECIPE and LORA_RECIPE: train_glue.py's LoRA adapters
    "--head_phase_share", "0.75",
    "--lora_layers", "top_2",
    "--per_device_train_batch_size", "1024",
    "--physical_batch_size", "256",
    "--max_steps", "75",
    "--learning_rate", "1e-2",
    "--head_learning_rate", "1e-3",
    "--head_warmup_steps", "0",
    "--sam_mode", "none",
    "--align_lambda", "0",
    "--logging_steps", "25",
]

ONE_PHASE_RECIPE: list[str] = [  # after LPFT_RECIPE: its flags back at DP_RECIPE's, LORA_RECIPE's and DPSAMConfig's
    "--head_phase_share", "0",
    "--lora_layers", "top_half",
    "--per_device_train_batch_size", "256",
    "--physical_batch_size", "64",
    "--max_steps", "40",
    "--learning_rate", "2e-3",
    "--head_learning_rate", "2e-2",
    "--head_warmup_steps", "0.25",
    "--sam_mode", "dp_sat",
    "--align_lambda", "0.05",
    "--logging_steps", "5",
]

HEAD_ONLY_RECIPE: list[str] = [  # on top of DP_RECIPE (later flags win): the head-only floor, --train_lora false
    "--per_device_train_batch_size", "1024",
    "--physical_batch_size", "1024",
    "--max_steps", "1000",
    "--learning_rate", "3e-3",
    "--head_learning_rate", "3e-3",
    "--sam_mode", "none",
    "--align_lambda", "0",
    "--logging_steps", "250",
]


def recipe_value(recipe: list[str], flag: str) -> str:
    """The value a recipe gives ``flag`` (its last occurrence)."""
    values = [recipe[i + 1] for i, item in enumerate(recipe[:-1]) if item == flag]
    if not values:
        raise KeyError(f"the recipe does not set {flag}")
    return values[-1]
