"""What the quality benchmark runs: the grids, their cells (trainer × ε × seed) and each trainer's flags.

The ``stress*`` grids make merging hard and compare fairly: six overlapping tasks, LoRA on every layer
and module, every merge tuned alike on validation splits (:mod:`.merge_space`, :mod:`.tuning`), a head-only floor
(:mod:`.floor`), a noise-injection arm (:mod:`.noise_injection`) and paired significance tests
(:mod:`benchmarks.significance`).
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.merging import MERGE_CONFIGS

# flags appended after DP_RECIPE and the grid's flags (later flags win); ρ, λ, lr, C stay DP_RECIPE's / DPSAMConfig's
TRAINERS: dict[str, list[str]] = {
    "non_private": ["--dp", "false", "--sam_mode", "none", "--align_lambda", "0"],
    "dp_sgd": ["--sam_mode", "none", "--align_lambda", "0"],
    "dp_merging": ["--sam_mode", "dp_sat"],  # DP-SAT ascent + alignment penalty at DPSAMConfig's λ
    "two_query": ["--sam_mode", "two_query"],  # the paper's two privatised queries, accounted at σ/√2
    # the floor: LoRA frozen at B = 0, only the task head trains (under DP, accounted like any other release)
    "head_only": ["--sam_mode", "none", "--align_lambda", "0", "--train_lora", "false"],
}
CELL_ARGUMENTS = frozenset({flag[2:] for flags in TRAINERS.values() for flag in flags if flag.startswith("--")} | {
    "seed", "dp_seed", "target_epsilon", "runs_dir", "overwrite", "disable_tqdm", "max_eval_samples",
    "model_name_or_path"})
"""Arguments the benchmark sets for each cell after the grid's flags (``run.train_arguments``): not the grid's."""
FLOOR_TRAINER = "head_only"
NON_PRIVATE_FLOOR_FLAGS = ["--dp", "false"]  # the floor without ε: DP_RECIPE would otherwise train it at ε = 8
QUALITY_TRAINERS = ("non_private", "dp_sgd", "dp_merging", "two_query")
# mergekit 0.1.5's task-vector methods that apply to LoRA task vectors (see merge_space), and ours
STRESS_MERGES = ("task_arithmetic", "ties", "dare_ties", "della", "breadcrumbs_ties", "cauchy_poe", "dp_aware")
STRESS_FULL_MERGES = ("task_arithmetic", "ties", "dare_ties", "dare_linear", "della", "della_linear", "breadcrumbs",
                      "breadcrumbs_ties", "sce", "cauchy_poe", "dp_aware")
HEADLINE_EPSILON = 4.0
SHARPNESS_RHO = 0.05  # the measuring radius of Sharp_t, the same for every trainer (the paper's ρ)
DIAGNOSTIC_SPLIT = "validation"


@dataclass(frozen=True)
class Stress:
    """What a stress grid adds: every merge tuned on ≤ ``validation_samples`` validation examples per task over
    :mod:`.merge_space`'s points, a head-only floor, and the noise-injection arm at ``noise_levels`` (σ of the
    Gaussian noise added to the non-private adapters' LoRA factors, on their first ``noise_seeds`` seeds).
    ``headline_trainers`` at ε = 4 (and non-private) run every seed; ``floor_every_seed`` runs the floor on every
    seed of the headline cells (else on the first). ``seed_test_subsets``: each seed scores its own seeded
    stratified subset of ≤ ``max_eval_samples`` test examples per task (every group of a seed the same one),
    instead of one subset (the split seed's) shared by every seed."""

    validation_samples: int
    noise_levels: tuple[float, ...]
    noise_seeds: int
    headline_trainers: tuple[str, ...] = ("dp_sgd", "dp_merging")
    floor_every_seed: bool = True
    seed_test_subsets: bool = False


@dataclass(frozen=True)
class Grid:
    """What one ``--grid`` runs. ``seeds`` apply to the headline cells (ε = 4 and non-private) and, with
    ``seed_every_epsilon``, to every cell; other cells run the first seed only. ``stress`` makes it a stress
    grid (tuned merges, floor, noise arm, per-example scores)."""

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
    stress: Stress | None = None


TASKS = ("rotten_tomatoes", "election_tweets", "reuters_r8", "bbc_news")
GRIDS: dict[str, Grid] = {
    "full": Grid(
        tasks=TASKS, trainers=QUALITY_TRAINERS, epsilons=(1.0, 4.0, 8.0), merges=tuple(MERGE_CONFIGS), seeds=3,
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
        tasks=("rotten_tomatoes", "bbc_news"), trainers=QUALITY_TRAINERS, epsilons=(HEADLINE_EPSILON,),
        merges=tuple(MERGE_CONFIGS), seeds=1, seed_every_epsilon=False,
        train_flags=("--per_device_train_batch_size", "16", "--physical_batch_size", "16", "--max_steps", "3",
                     "--max_length", "32", "--max_train_samples", "200"),
        max_eval_samples=48, diagnostic_samples=24, hessian_iterations=2, gammas=(0.0, 0.5, 1.0),
        reductions="a smoke test, not a benchmark: 2 tasks, 3 steps of 16 examples from 200, 48 test examples",
    ),
}

STRESS_TASKS = ("reuters_r8", "reuters_r52", "20newsgroups", "rotten_tomatoes", "election_tweets", "bbc_news")
# LoRA that interferes: every layer, attention (q, k, v, o) and feed-forward (intermediate, output) matrices, r = 16
STRESS_LORA = ("--lora_layers", "all", "--lora_target_modules",
               "query,key,value,attention.output.dense,intermediate.dense,output.dense",
               "--lora_r", "16", "--lora_alpha", "32")
STRESS_CPU_FLAGS = ("--per_device_train_batch_size", "32", "--physical_batch_size", "32", "--max_steps", "60",
                    "--max_length", "32")
GRIDS.update({
    "stress-full": Grid(
        tasks=STRESS_TASKS, trainers=(*QUALITY_TRAINERS, FLOOR_TRAINER), epsilons=(1.0, 4.0, 8.0),
        merges=STRESS_FULL_MERGES, seeds=3,
        seed_every_epsilon=True, train_flags=(*STRESS_LORA, "--max_steps", "200"), max_eval_samples=None,
        diagnostic_samples=256, hessian_iterations=10, gammas=(0.0, 0.25, 0.5, 0.75, 1.0),
        reductions="none: DP_RECIPE with 200 steps, full test splits, 3 seeds in every cell, 11 merge methods, "
                   "4 noise levels",
        stress=Stress(validation_samples=1000, noise_levels=(0.002, 0.005, 0.01, 0.02), noise_seeds=3),
    ),
    "stress": Grid(
        tasks=STRESS_TASKS, trainers=(*QUALITY_TRAINERS, FLOOR_TRAINER), epsilons=(1.0, 4.0, 8.0),
        merges=STRESS_MERGES, seeds=3,
        seed_every_epsilon=False, train_flags=(*STRESS_LORA, *STRESS_CPU_FLAGS), max_eval_samples=250,
        diagnostic_samples=16, hessian_iterations=1, gammas=(0.0, 0.5, 1.0),
        reductions="expected batch 32 and 60 steps instead of 256 and 200; inputs truncated to 32 tokens; test "
                   "subsets of ≤ 250 and tuning on ≤ 80 validation examples per task; 7 merge methods (no "
                   "dare_linear, della_linear, breadcrumbs, sce); 3 seeds only for the headline cells (ε = 4 "
                   "DP-SGD and DP-Merging, non-private), 1 elsewhere and for every floor; noise arm on seed 0 at "
                   "3 levels; diagnostics on 16 validation examples, 1 power-iteration step",
        stress=Stress(validation_samples=80, noise_levels=(0.005, 0.01, 0.02), noise_seeds=1,
                      floor_every_seed=False),
    ),
    "stress-smoke": Grid(
        tasks=("rotten_tomatoes", "bbc_news"), trainers=("non_private", "dp_sgd", "dp_merging", FLOOR_TRAINER),
        epsilons=(HEADLINE_EPSILON,), merges=("ties", "dp_aware"), seeds=2, seed_every_epsilon=False,
        train_flags=(*STRESS_LORA, "--lora_r", "4", "--per_device_train_batch_size", "16", "--physical_batch_size",
                     "16", "--max_steps", "3", "--max_length", "32", "--max_train_samples", "200"),
        max_eval_samples=48, diagnostic_samples=16, hessian_iterations=1, gammas=(0.0, 1.0),
        reductions="a smoke test, not a benchmark: 2 tasks, r = 4, 3 steps of 16 examples from 200, 48 test and "
                   "32 validation examples, 2 merges, 2 seeds",
        stress=Stress(validation_samples=32, noise_levels=(0.01,), noise_seeds=1, floor_every_seed=False),
    ),
})


@dataclass(frozen=True)
class Cell:
    """One set of adapters: a trainer at a privacy level (None: non-private) and a seed; ``noise_std`` set: the
    noise-injection arm, the non-private adapters of ``seed`` with N(0, σ²) added to their LoRA factors."""

    trainer: str
    epsilon: float | None
    seed: int
    noise_std: float | None = None

    @property
    def name(self) -> str:
        if self.noise_std is not None:
            return f"noise{self.noise_std:g}-seed{self.seed}"
        level = "" if self.epsilon is None else f"-eps{self.epsilon:g}"
        return f"{self.trainer}{level}-seed{self.seed}"

    @property
    def merged(self) -> bool:
        """Whether the cell's adapters are merged (the floor's are not: their LoRA is zero)."""
        return self.trainer != FLOOR_TRAINER


def trainer_flags(cell: Cell) -> list[str]:
    """The flags of the cell's trainer (the non-private floor adds ``--dp false``)."""
    flags = TRAINERS[cell.trainer]
    return [*flags, *NON_PRIVATE_FLOOR_FLAGS] if cell.trainer == FLOOR_TRAINER and cell.epsilon is None else flags


NOISE_ARM = "noise_injection"


def is_headline(grid: Grid, cell: Cell) -> bool:
    """Headline cells: non-private and ε = 4 (stress grids: the headline trainers at ε = 4, and their floors)."""
    if cell.noise_std is not None:
        return False
    if cell.epsilon is None:
        return True
    if cell.epsilon != HEADLINE_EPSILON:
        return False
    return grid.stress is None or cell.trainer in (*grid.stress.headline_trainers, FLOOR_TRAINER)


def plan_cells(grid: Grid, seeds: int) -> list[Cell]:
    """The grid's cells, headline ones first (first seed, ε = 4), so a partial run already answers most. A stress
    grid adds the floor (non-private and every ε) and, after the non-private cells they read, the noise arm."""
    cells = []
    for trainer in grid.trainers:
        levels = [None] if trainer == "non_private" else list(grid.epsilons)
        if trainer == FLOOR_TRAINER:
            levels = [None, *grid.epsilons]
        for epsilon in levels:
            cell = Cell(trainer, epsilon, 0)
            every = is_headline(grid, cell) or grid.seed_every_epsilon
            if trainer == FLOOR_TRAINER and grid.stress is not None and not grid.stress.floor_every_seed:
                every = False
            for seed in range(seeds if every else 1):
                cells.append(Cell(trainer, epsilon, seed))
    if grid.stress is not None and "non_private" in grid.trainers:
        cells += [Cell("non_private", None, seed, noise_std=sigma) for sigma in grid.stress.noise_levels
                  for seed in range(min(seeds, grid.stress.noise_seeds))]
    priority = {HEADLINE_EPSILON: 0, 8.0: 1}
    return sorted(cells, key=lambda c: (grid.stress is not None and not is_headline(grid, c),
                                        c.noise_std is not None, c.seed,
                                        priority.get(c.epsilon, 0 if c.epsilon is None else 2),
                                        grid.trainers.index(c.trainer), c.epsilon or 0, c.noise_std or 0))
