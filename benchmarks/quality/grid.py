"""What the quality benchmark runs: the grids, their cells (trainer × ε × seed) and each trainer's flags."""

from __future__ import annotations

from dataclasses import dataclass

# flags appended after DP_RECIPE and the grid's flags (later flags win); ρ, λ, lr, C stay DP_RECIPE's / DPSAMConfig's
TRAINERS: dict[str, list[str]] = {
    "non_private": ["--dp", "false", "--sam_mode", "none", "--align_lambda", "0"],
    "dp_sgd": ["--sam_mode", "none", "--align_lambda", "0"],
    "dp_merging": ["--sam_mode", "dp_sat"],  # DP-SAT ascent + alignment penalty at DPSAMConfig's λ
    "two_query": ["--sam_mode", "two_query"],  # the paper's two privatised queries, accounted at σ/√2
}
MERGE_CONFIGS = {"task_arithmetic": "task_arithmetic.yaml", "ties": "ties.yaml", "cauchy_poe": "cauchy_poe.yaml",
                 "dp_aware": "dp.yaml"}
HEADLINE_EPSILON = 4.0
SHARPNESS_RHO = 0.05  # the measuring radius of Sharp_t, the same for every trainer (the paper's ρ)
DIAGNOSTIC_SPLIT = "validation"


@dataclass(frozen=True)
class Grid:
    """What one ``--grid`` runs. ``seeds`` apply to the headline cells (ε = 4 and non-private) and, with
    ``seed_every_epsilon``, to every cell; other cells run the first seed only."""

    tasks: tuple[str, ...]
    trainers: tuple[str, ...]
    epsilons: tuple[float, ...]
    merges: tuple[str, ...]
    seeds: int
    seed_every_epsilon: bool
    train_flags: tuple[str, ...]
    max_eval_samples: int | None
    diagnostic_samples: int
    hessian_iterations: int
    gammas: tuple[float, ...]
    reductions: str


TASKS = ("rotten_tomatoes", "election_tweets", "reuters_r8", "bbc_news")
GRIDS: dict[str, Grid] = {
    "full": Grid(
        tasks=TASKS, trainers=tuple(TRAINERS), epsilons=(1.0, 4.0, 8.0), merges=tuple(MERGE_CONFIGS), seeds=3,
        seed_every_epsilon=True, train_flags=(), max_eval_samples=None, diagnostic_samples=512,
        hessian_iterations=20, gammas=tuple(i / 10 for i in range(11)),
        reductions="none: DP_RECIPE as they are, full test splits, 3 seeds in every cell",
    ),
    "cpu": Grid(
        tasks=TASKS, trainers=("non_private", "dp_sgd", "dp_merging"), epsilons=(4.0, 8.0), merges=tuple(MERGE_CONFIGS),
        seeds=1, seed_every_epsilon=False,
        train_flags=("--per_device_train_batch_size", "256", "--max_steps", "30", "--max_length", "32"),
        max_eval_samples=1000, diagnostic_samples=128, hessian_iterations=6, gammas=(0.0, 0.25, 0.5, 0.75, 1.0),
        reductions="no two_query trainer; ε ∈ {4, 8} (no ε = 1); 1 seed (no ± std); expected batch 256 and 30 steps "
                   "instead of DP_RECIPE's; inputs truncated to 32 tokens; test subsets of ≤ 1000 examples per task; "
                   "diagnostics on 128 validation examples, 6 power-iteration steps, 5 interpolation points",
    ),
    "smoke": Grid(
        tasks=("rotten_tomatoes", "bbc_news"), trainers=tuple(TRAINERS), epsilons=(HEADLINE_EPSILON,),
        merges=tuple(MERGE_CONFIGS), seeds=1, seed_every_epsilon=False,
        train_flags=("--per_device_train_batch_size", "16", "--physical_batch_size", "16", "--max_steps", "3",
                     "--max_length", "32", "--max_train_samples", "200"),
        max_eval_samples=48, diagnostic_samples=24, hessian_iterations=2, gammas=(0.0, 0.5, 1.0),
        reductions="a smoke test, not a benchmark: 2 tasks, 3 steps of 16 examples from 200, 48 test examples",
    ),
}


@dataclass(frozen=True)
class Cell:
    """One set of adapters: a trainer at a privacy level (None: non-private) and a seed."""

    trainer: str
    epsilon: float | None
    seed: int

    @property
    def name(self) -> str:
        level = "" if self.epsilon is None else f"-eps{self.epsilon:g}"
        return f"{self.trainer}{level}-seed{self.seed}"


def plan_cells(grid: Grid, seeds: int) -> list[Cell]:
    """The grid's cells, headline ones first (first seed, ε = 4), so a partial run already answers most."""
    cells = []
    for trainer in grid.trainers:
        levels = [None] if trainer == "non_private" else list(grid.epsilons)
        for epsilon in levels:
            headline = epsilon is None or epsilon == HEADLINE_EPSILON
            for seed in range(seeds if headline or grid.seed_every_epsilon else 1):
                cells.append(Cell(trainer, epsilon, seed))
    priority = {HEADLINE_EPSILON: 0, 8.0: 1}
    return sorted(cells, key=lambda c: (c.seed, priority.get(c.epsilon, 0 if c.epsilon is None else 2),
                                        grid.trainers.index(c.trainer), c.epsilon or 0))
