"""What the recipe benchmark trains: the candidate recipes, the proxy and report tasks, and the units."""

from __future__ import annotations

from dataclasses import dataclass

from hf_dpmerge.training.recipe import HEAD_ONLY_RECIPE

PROXY_TASKS = ("rotten_tomatoes", "election_tweets")
"""Recipes are chosen on these tasks' validation splits."""
REPORT_TASKS = ("reuters_r8", "reuters_r52", "20newsgroups", "bbc_news")
"""Reported on their test splits; never used to choose a recipe."""
SELECT_EPSILONS = (8.0,)  # the choice is made at ε = 8 (a 2-core machine's budget); reported at every ε
REPORT_EPSILONS = (1.0, 4.0, 8.0, None)  # None: non-private
SEEDED_EPSILONS = (4.0, 8.0)
REPORT_SEEDS = 3
FLOOR = "floor"
PACKAGED = "packaged"


BASE_FLAGS: tuple[str, ...] = (
    "--per_device_train_batch_size", "256", "--physical_batch_size", "64", "--max_steps", "40",
    "--learning_rate", "2e-3", "--head_learning_rate", "2e-2", "--lr_scheduler_type", "constant",
    "--weight_decay", "0.0", "--per_sample_max_grad_norm", "1.0", "--logging_steps", "5", "--save_strategy", "no",
    "--report_to", "none", "--lora_freeze_a", "false", "--head_warmup_steps", "0", "--sam_mode", "dp_sat",
    "--sam_rho", "0.05", "--align_lambda", "0.05", "--lora_layers", "top_half", "--head_phase_share", "0",
)
"""The packaged recipe this benchmark started from (``DP_RECIPE`` then), stated in full in every unit's command
line: a later change of ``DP_RECIPE`` (the benchmark's output) does not change what a stored unit means."""


@dataclass(frozen=True)
class Recipe:
    """A training recipe: train_glue.py flags appended after :data:`BASE_FLAGS` (later flags win)."""

    flags: tuple[str, ...]
    description: str
    candidate: bool = True  # trained in the select stage


RECIPES: dict[str, Recipe] = {
    FLOOR: Recipe(("--train_lora", "false", *HEAD_ONLY_RECIPE),
                  "frozen encoder + private linear head on cached features (HEAD_ONLY_RECIPE)", candidate=False),
    PACKAGED: Recipe((), "BASE_FLAGS: r = 8 on query/value of the top half, B = 256, 40 steps, lr 2e-3 / head 2e-2"),
    "ffa": Recipe(("--lora_freeze_a", "true"), "BASE_FLAGS with A frozen at its public-seed draw (FFA-LoRA)"),
    "ffa_head_first": Recipe(("--lora_freeze_a", "true", "--head_warmup_steps", "10"),
                             "FFA-LoRA, the first 10 of the 40 steps on the head alone (one accountant)"),
}


@dataclass(frozen=True)
class Unit:
    """One adapter: a recipe on a task at a privacy level (None: non-private) and a seed, in a stage."""

    stage: str
    recipe: str
    task: str
    epsilon: float | None
    seed: int

    @property
    def name(self) -> str:
        level = "nonprivate" if self.epsilon is None else f"eps{self.epsilon:g}"
        return f"{self.stage}/{self.recipe}-{self.task}-{level}-seed{self.seed}"

    @property
    def split(self) -> str:
        """The split the unit is scored on: validation while choosing, test when reporting."""
        return "validation" if self.stage == "select" else "test"


def select_units() -> list[Unit]:
    return [Unit("select", recipe, task, epsilon, 0) for epsilon in reversed(SELECT_EPSILONS)
            for recipe, spec in RECIPES.items() if spec.candidate for task in PROXY_TASKS]


def report_units(chosen: str) -> list[Unit]:
    """The report grid for ``chosen``, in the order the targets need it: the floor and ``chosen`` at ε = 8 (every
    seed), non-private, ε = 4 (every seed) and ε = 1; then the packaged recipe in the same order."""
    cells = [(8.0, seed) for seed in range(REPORT_SEEDS)] + [(None, 0)]
    cells += [(4.0, seed) for seed in range(REPORT_SEEDS)] + [(1.0, 0)]
    groups = [(FLOOR, chosen), (PACKAGED,)] if chosen != PACKAGED else [(FLOOR, PACKAGED)]
    return [Unit("report", recipe, task, epsilon, seed) for recipes in groups for epsilon, seed in cells
            for recipe in recipes for task in REPORT_TASKS]
