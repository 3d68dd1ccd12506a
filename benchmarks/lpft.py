"""Private LP-FT on a cached prefix against the private head, at the same ε (issue: private adapters worth releasing).

Protocol (recipes chosen without the evaluated tasks' test data):

1. **select** — the private head (``--train_lora false``, ``HEAD_ONLY_RECIPE``) and every candidate of
   :data:`CANDIDATES` train on the two *select* tasks (:data:`SELECT_TASKS`: rotten_tomatoes, the headroom task of
   ``benchmarks/reports/headroom/HEADROOM.md``, and bbc_news, a topic task) at ε = 8, seed 0, and are scored on
   those tasks' validation splits. The chosen candidate has the highest mean validation gain over the head.
   Past the scratch pilot's recipe and its DP-SAT twin, the candidates move one axis at a time at about the same
   compute or less: the layers k, the learning rate, the budget split ε₁, the rank, automatic clipping (Bu et
   al.). ``--candidates`` runs a subset, so two processes can share the stage.
2. **report** — the head and the chosen candidate on every packaged task at ``--epsilon`` (default 8; the
   candidates' ε₁ keep their share of it) and the seeds of ``--seeds``, scored on the whole test split; the two
   select tasks are marked (the others are held out). Per (task, ε) with ≥ 2 seeds: the paired t-test over seeds
   (the seed is the unit: each retrains both), Holm-corrected over the recipe's tested rows (one family per
   recipe). The targets section judges each row against :data:`FLOOR_TOLERANCE` and, on headroom tasks,
   :data:`HEADROOM_TARGETS`, with the non-private headroom of ``benchmarks/reports/headroom/``
   (:func:`headroom_points`). The default (:data:`DEFAULT_CANDIDATE`) and the earlier defaults
   (:data:`EARLIER_DEFAULTS`) are reported beside the choice; ``--candidates`` also runs the report-stage twins
   (:data:`TWINS`), never chosen, for ``benchmarks/lpft_merge.py``.

Every candidate is private LP-FT in one accounted run (docs/design.md §15.6): phase 1 the head alone at ε₁
(``--head_phase_epsilon``; ``HEAD_ONLY_RECIPE``'s 1000 steps × 1024), phase 2 FFA-LoRA (A frozen, B = 0: it starts
at the phase-1 model) on the top k layers from the cached prefix, head and B trained, both phases composed to ε = 8;
phase 2 takes the package's DP-SAT step and alignment penalty unless the candidate's name ends in ``_dpsgd``.
Units are stored as JSON under ``benchmarks/reports/lpft/units/``; the report is rewritten from them.

``--base smollm2`` runs the same protocol on the packaged SmolLM2-135M as a sequence classifier (the head reads the
last non-padding token; LoRA on q/v below it, on the cached prefix): its own candidates
(:data:`SMOLLM2_CANDIDATES`, its own private head among them), units and report (``benchmarks/reports/lpft-smollm2``);
it never writes the floor gap of the packaged default.

    python -m benchmarks.lpft --stage select
    python -m benchmarks.lpft --stage report --seeds 0,1,2
    python -m benchmarks.lpft --stage report --seeds 0,1,2 --epsilon 4 --tasks rotten_tomatoes
    python -m benchmarks.lpft --report-only
    python -m benchmarks.lpft --base smollm2 --stage select
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from scipy import stats

from hf_dpmerge.data.tasks import PACKAGED_TASKS
from hf_dpmerge.utils.io import write_text_atomic

from . import harness
from .markdown import table as markdown_table
from .quality.significance import ALPHA, holm

REPO = Path(__file__).resolve().parent.parent
REPORT_DIR = REPO / "benchmarks" / "reports" / "lpft"
FLOOR_GAP_EVIDENCE = REPO / "hf_dpmerge" / "merging" / "data" / "recipe_floor_gap.json"
"""What ``hf-dpmerge recommend``'s head-only check reads: :func:`floor_gap`, rewritten with the report."""
SELECT_TASKS = ("rotten_tomatoes", "bbc_news")
EPSILON = 8.0
HEAD = "private_head"
FLOOR_TOLERANCE = 0.3
"""Points the default adapter may fall below the private head, on every task at every ε (phase 2 starts at it)."""
HEADROOM_POINTS = 2.0
"""A headroom task's non-private headroom (the headroom study's threshold)."""
HEADROOM_TARGETS = {8.0: (1.0, 0.5), 4.0: (0.5, None)}
"""On a headroom task, per ε: the mean gain over the private head (points; at ε = 8 Holm-significant over seeds too)
and the share of the non-private headroom, (DP adapter − private head) / (non-private LoRA − non-private head)."""


def _lpft(k: int, batch: int, steps: int, lr: str, head_epsilon: float, sam: bool = True,
          *extra: str) -> tuple[str, ...]:
    step = (("--sam_mode", "dp_sat", "--sam_rho", "0.05", "--align_lambda", "0.05") if sam
            else ("--sam_mode", "none", "--align_lambda", "0"))  # stated either way: the defaults move
    return ("--head_phase_epsilon", f"{head_epsilon:g}", "--lora_freeze_a", "true", "--head_warmup_steps", "0",
            "--cache_prefix", "true", "--lora_layers", f"top_{k}", "--per_device_train_batch_size", str(batch),
            "--physical_batch_size", "256", "--max_steps", str(steps), "--learning_rate", lr,
            "--head_learning_rate", "1e-3", "--logging_steps", "25", *step, *extra)


CANDIDATES: dict[str, tuple[str, ...]] = {
    HEAD: ("--train_lora", "false"),
    "k2_b1024_t75_lr3e-3_head6": _lpft(2, 1024, 75, "3e-3", 6),  # the scratch pilot's recipe
    "k2_b1024_t75_lr3e-3_head6_dpsgd": _lpft(2, 1024, 75, "3e-3", 6, sam=False),  # no DP-SAT, no alignment
    # the wider search: one axis at a time away from the candidate above, at its compute or less (a batch of 2048
    # exceeds bbc_news' 1602 training examples; k = 3 was not run for time)
    "k1_b1024_t75_lr3e-3_head6_dpsgd": _lpft(1, 1024, 75, "3e-3", 6, False),  # layers
    "k2_b1024_t75_lr1e-2_head6_dpsgd": _lpft(2, 1024, 75, "1e-2", 6, False),  # learning rate
    "k2_b1024_t75_lr3e-2_head6_dpsgd": _lpft(2, 1024, 75, "3e-2", 6, False),
    "k2_b1024_t75_lr3e-3_head4_dpsgd": _lpft(2, 1024, 75, "3e-3", 4, False),  # budget split: ε₁ = ε/2
    "k2_r2_b1024_t75_lr3e-3_head6_dpsgd": _lpft(2, 1024, 75, "3e-3", 6, False, "--lora_r", "2", "--lora_alpha",
                                                "4"),  # rank, at the same scale α/r = 2
    "k2_b1024_t75_lr3e-3_head6_auto_dpsgd": _lpft(2, 1024, 75, "3e-3", 6, False, "--clipping", "automatic"),
}
TWINS: dict[str, tuple[str, ...]] = {
    # the default's DP-Merging twin: phase 2 with the package's DP-SAT step and alignment (benchmarks/lpft_merge.py)
    "k2_b1024_t75_lr1e-2_head6": _lpft(2, 1024, 75, "1e-2", 6),
}
SMOLLM2_CANDIDATES: dict[str, tuple[str, ...]] = {
    HEAD: ("--train_lora", "false"),
    # MiniLM's chosen recipe moved SmolLM2's phase-2 loss only from 0.68 to 0.66 (docs/causal-lm.md): larger steps
    "k2_b1024_t75_lr3e-3_head6_dpsgd": _lpft(2, 1024, 75, "3e-3", 6, sam=False),
    # 3e-3 → 1e-2 lowered the mean validation gain (−1.60 → −1.82 points): 3·10⁻² was pruned unrun (30–85 min a unit)
    "k2_b1024_t75_lr1e-2_head6_dpsgd": _lpft(2, 1024, 75, "1e-2", 6, sam=False),
}


@dataclass(frozen=True)
class Base:
    """A base model the search runs on: its candidates (the private head among them), where its units and report
    live, and whether it writes ``recommend``'s floor gap (the packaged default only). A base with ``causal_lm`` set
    is the packaged SmolLM2, built once under the work folder (:func:`ensure_smollm2_base`) and trained as a sequence
    classifier, LoRA on q/v below its head (:func:`arguments` adds those flags). ``default`` is the candidate the
    training script's LoRA default encodes, if any (:data:`DEFAULT_CANDIDATE`), and those it encoded before it.
    ``twins`` run in the report stage by name only (:data:`TWINS`): the select stage neither runs nor waits for them."""
    name: str
    candidates: dict[str, tuple[str, ...]]
    report_dir: Path
    evidence: Path | None
    causal_lm: bool = False
    default: str | None = None
    earlier_defaults: tuple[str, ...] = ()
    twins: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def flags(self, candidate: str) -> tuple[str, ...]:
        """A candidate's flags, a select candidate's or a twin's."""
        return {**self.candidates, **self.twins}[candidate]


DEFAULT_CANDIDATE = "k2_b1024_t75_lr1e-2_head6_dpsgd"
"""The candidate ``LPFT_RECIPE`` encodes, the training script's LoRA default (a test parses both alike); what
``recommend``'s floor gap measures: the wider search's choice (2026-12-06). Were the select stage to choose another,
the report shows both until the default moves to it."""
EARLIER_DEFAULTS = ("k2_b1024_t75_lr3e-3_head6_dpsgd",)
"""Candidates ``LPFT_RECIPE`` encoded before :data:`DEFAULT_CANDIDATE` (newest first): the report keeps their rows."""
BASES = {"minilm": Base("minilm", CANDIDATES, REPORT_DIR, FLOOR_GAP_EVIDENCE, default=DEFAULT_CANDIDATE,
                        earlier_defaults=EARLIER_DEFAULTS, twins=TWINS),
         "smollm2": Base("smollm2", SMOLLM2_CANDIDATES, REPO / "benchmarks" / "reports" / "lpft-smollm2", None,
                         causal_lm=True)}
MINILM = BASES["minilm"]


def smollm2_base_dir(work_dir: Path) -> Path:
    return work_dir / "smollm2_base"


def ensure_smollm2_base(work_dir: Path) -> Path:
    """The packaged SmolLM2 as a float32 checkpoint under ``work_dir`` (written once, atomically by rename)."""
    from hf_dpmerge.data.model_path import default_causal_gguf
    from hf_dpmerge.modeling.causal_base import save_causal_base

    target = smollm2_base_dir(work_dir)
    if not target.exists():
        staged = target.with_name(target.name + ".partial")
        shutil.rmtree(staged, ignore_errors=True)
        save_causal_base(default_causal_gguf(), staged)
        staged.rename(target)
    return target


def arguments(task: str, candidate: str, seed: int, runs_dir: Path, epsilon: float = EPSILON,
              base: Base = MINILM) -> list[str]:
    """The unit's train_glue.py flags; every unit of a task shares its frozen prefixes (``--prefix_cache_dir``
    beside the runs: the pooled features of the head phase, the states below the LoRA layers). A candidate's ε₁
    is stated at ε = 8 and scales with the target ε (the head phase keeps its share of the budget)."""
    flags = list(base.flags(candidate))
    if "--head_phase_epsilon" in flags:
        at = flags.index("--head_phase_epsilon") + 1
        flags[at] = f"{float(flags[at]) * epsilon / EPSILON:g}"
    if base.causal_lm:
        flags += ["--model_name_or_path", str(smollm2_base_dir(runs_dir.parent)), "--lora_target_modules",
                  "q_proj,v_proj"]
    return [*flags, "--target_epsilon", f"{epsilon:g}", "--task", task, "--seed", str(seed),
            "--runs_dir", str(runs_dir), "--prefix_cache_dir", str(runs_dir.parent / "prefix_cache"),
            "--overwrite", "true", "--disable_tqdm", "true"]


def epsilon_suffix(epsilon: float) -> str:
    """What a name gains at a target ε other than :data:`EPSILON` (``-eps4``; nothing at ε = 8)."""
    return "" if epsilon == EPSILON else f"-eps{epsilon:g}"


def unit_name(task: str, candidate: str, seed: int, epsilon: float = EPSILON) -> str:
    """A unit is one training run, whichever stage first asked for it (select units of seed 0 are reported too)."""
    return f"{task}-{candidate}-seed{seed}{epsilon_suffix(epsilon)}"


def target_epsilon(unit: dict) -> float:
    """The unit's target ε (units stored before ``--epsilon`` existed ran at :data:`EPSILON`)."""
    return unit.get("target_epsilon", EPSILON)


def load_units(units_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(units_dir.glob("*.json"))]


def chosen_candidate(units: list[dict], candidates: dict[str, tuple[str, ...]] = CANDIDATES
                     ) -> tuple[str | None, dict[str, float]]:
    """The candidate with the highest mean validation gain over the head on the select tasks (None until every
    select unit is stored), and each candidate's mean gain in points."""
    score = {(u["task"], u["candidate"]): u["validation"]["accuracy"] for u in units
             if u["task"] in SELECT_TASKS and u["seed"] == 0 and target_epsilon(u) == EPSILON}
    gains = {}
    for candidate in candidates:
        if candidate != HEAD and all((t, c) in score for t in SELECT_TASKS for c in (candidate, HEAD)):
            gains[candidate] = statistics.mean(100 * (score[(t, candidate)] - score[(t, HEAD)]) for t in SELECT_TASKS)
    complete = len(gains) == len(candidates) - 1
    return (max(gains, key=gains.get) if complete else None), gains


def floor_gap(units: list[dict]) -> dict:
    """Per target ε: the default recipe's (:data:`DEFAULT_CANDIDATE`'s) DP adapters against the private head, test
    accuracy in points averaged over the tasks both have at seed 0, over the seeds that hold all of those tasks;
    the difference per seed and a two-sided paired t-test (seeds are the unit; None with fewer than 2 seeds)."""
    recipe = DEFAULT_CANDIDATE
    rows = []
    for epsilon in sorted({target_epsilon(u) for u in units}, reverse=True):
        test = {(u["task"], u["candidate"], u["seed"]): 100 * u["test"]["accuracy"] for u in units
                if target_epsilon(u) == epsilon}
        tasks = [t for t in PACKAGED_TASKS if all((t, c, 0) in test for c in (HEAD, recipe))]
        seeds = sorted({s for (_, _, s) in test
                        if tasks and all((t, c, s) in test for t in tasks for c in (HEAD, recipe))})
        if not seeds:
            continue
        ours = [statistics.mean(test[(t, recipe, s)] for t in tasks) for s in seeds]
        head = [statistics.mean(test[(t, HEAD, s)] for t in tasks) for s in seeds]
        diffs = [a - b for a, b in zip(ours, head)]
        p = float(stats.ttest_rel(ours, head).pvalue) if len(seeds) > 1 and len(set(diffs)) > 1 else None
        rows.append({"epsilon": epsilon, "tasks": tasks, "adapters": round(statistics.mean(ours), 2),
                     "floor": round(statistics.mean(head), 2), "difference": round(statistics.mean(diffs), 2),
                     "seeds": seeds, "p": p})
    return {"report": "benchmarks/reports/lpft/LPFT.md", "recipe": recipe, "split": "test", "rows": rows}


def headroom_points(headroom: list[dict]) -> dict[str, float]:
    """Per task, the headroom study's LoRA top 2 (the budget) − head, mean test accuracy over each arm's seeds."""
    tests: dict[tuple[str, str], list[float]] = {}
    for unit in headroom:
        tests.setdefault((unit["settings"]["task"], unit["settings"]["arm"]), []).append(
            100 * unit["result"]["test"]["accuracy"])
    return {task: statistics.mean(tests[(task, "lora_top2")]) - statistics.mean(tests[(task, "head")])
            for task in PACKAGED_TASKS if (task, "lora_top2") in tests and (task, "head") in tests}


def run_unit(task: str, argv: list[str], seed: int, work_dir: Path, path: Path, keep: Path | None = None,
             **about: object) -> dict:
    """Train ``task`` with train_glue.py's ``argv`` (its ``--runs_dir`` under ``work_dir``; deleted afterwards,
    except the released folders, moved to ``keep/<path's stem>/<task>/`` when ``keep`` is given), score it on the
    validation and the whole test split, store the result (and ``about``) at ``path``."""
    import gc

    from .training import train_in_process, validation_metrics

    runs_dir = Path(argv[argv.index("--runs_dir") + 1])
    summary, seconds, base_dir = train_in_process(task, argv, seed, work_dir)
    named = [("<runs>" if a == str(runs_dir) else a.replace(str(work_dir), "<work>")) for a in argv]
    result = {"task": task, "seed": seed, **about, "argv": named,
              "test": summary["test"], "validation": validation_metrics(task, runs_dir, base_dir),
              "train_seconds": seconds, "steps": summary["steps"], "epsilon": summary["epsilon"]}
    if keep is not None:  # before the unit counts as done: a kept unit always has its adapter
        kept = keep / path.stem / task
        shutil.rmtree(kept, ignore_errors=True)
        kept.mkdir(parents=True)
        for name in ("adapter", "encoder_adapter", "eval_metrics.json"):
            shutil.move(runs_dir / task / name, kept / name)
    write_text_atomic(path, json.dumps(result, indent=1, allow_nan=True) + "\n")
    shutil.rmtree(runs_dir, ignore_errors=True)
    gc.collect()
    return result


def target_verdicts(epsilon: float, gain: float, significant: bool, headroom_points: float | None) -> list[str]:
    """The targets for one (task, ε) row of the report: never below the head by more than
    :data:`FLOOR_TOLERANCE`; on a headroom task (≥ ``HEADROOM_POINTS`` of non-private headroom), the gain
    and the captured share of :data:`HEADROOM_TARGETS`. Each cell reads "holds" or "not met" with its value."""
    def verdict(ok: bool, value: str) -> str:
        return f"{'holds' if ok else 'not met'} ({value})"

    cells = [verdict(gain >= -FLOOR_TOLERANCE, f"{gain:+.2f}")]
    if headroom_points is None:
        return cells + ["—", "—", "—"]
    share = gain / headroom_points if headroom_points > 0 else None
    cells += [f"{headroom_points:.1f}", "—" if share is None else f"{100 * share:.0f} %"]
    if headroom_points < HEADROOM_POINTS or epsilon not in HEADROOM_TARGETS:
        return cells + ["— (not a headroom task)" if headroom_points < HEADROOM_POINTS else "—"]
    minimum, min_share = HEADROOM_TARGETS[epsilon]
    parts = [verdict(gain >= minimum and (significant or epsilon != EPSILON), f"≥ +{minimum:g}"
                     + (", Holm-significant" if epsilon == EPSILON else ""))]
    if min_share is not None:
        parts.append(verdict(share is not None and share >= min_share, f"≥ {100 * min_share:.0f} % of the headroom"))
    return cells + ["; ".join(parts)]


def write_report(units: list[dict], path: Path, evidence: Path | None = FLOOR_GAP_EVIDENCE,
                 headroom_units: list[dict] | None = None, base: Base = MINILM) -> str:
    """Write ``base``'s report to ``path`` and (unless None) the floor gap ``recommend`` reads to ``evidence``;
    with ``headroom_units`` (the headroom table's, measured on ``base``), the targets section too."""
    candidates = base.candidates
    chosen, gains = chosen_candidate(units, candidates)
    select = {(u["task"], u["candidate"]): u for u in units
              if u["task"] in SELECT_TASKS and u["seed"] == 0 and target_epsilon(u) == EPSILON}
    seconds = {c: [select[(t, c)]["train_seconds"] for t in SELECT_TASKS if (t, c) in select] for c in candidates}
    rows = [[c, *(f"{100 * select[(t, c)]['validation']['accuracy']:.1f}" if (t, c) in select else "—"
                  for t in SELECT_TASKS), "—" if c == HEAD else (f"{gains[c]:+.2f}" if c in gains else "—"),
             f"{max(seconds[c]) / 60:.1f}" if seconds[c] else "—"]  # no stored unit: no time, not 0
            for c in candidates]
    command = "python -m benchmarks.lpft" + ("" if base == MINILM else f" --base {base.name}") + " --report-only"
    text = ["# Private LP-FT vs the private head at the same ε"
            + ("" if base == MINILM else f" (base: {base.name})"), "",
            f"Generated by `{command}` from {len(units)} stored units.", "",
            f"## Select (validation accuracy %, ε = {EPSILON:g}, seed 0)", "",
            markdown_table(["candidate", *SELECT_TASKS, "mean gain over head (points)", "longest unit (min)"], rows),
            "", f"Chosen: `{chosen}`." if chosen else "Chosen: — (select stage incomplete).", ""]
    if chosen and gains[chosen] < 0:
        text[-1:-1] = [f"Every candidate's mean validation gain is below 0: on the select tasks' validation splits the "
                       f"private head beats them all (the chosen one by {-gains[chosen]:.2f} points)."]
    if chosen and base.default and chosen != base.default:
        text[-1:-1] = [f"The default (`LPFT_RECIPE`) is still `{base.default}`, not the chosen candidate: the report "
                       "below shows both."]
    if chosen and base.earlier_defaults:
        text[-1:-1] = ["Earlier defaults keep their rows below: " + ", ".join(f"`{c}`" for c in base.earlier_defaults)
                       + "."]
    reported = [c for c in dict.fromkeys([chosen, base.default, *base.earlier_defaults]) if c] if chosen else []
    by = {(u["task"], u["candidate"], u["seed"], target_epsilon(u)): u for u in units}
    rows, p_values, cells = {c: [] for c in reported}, [], []  # p-values and cells in the order of the tables' rows
    for candidate in reported:
        for epsilon in sorted({e for (*_, e) in by}, reverse=True):
            for task in PACKAGED_TASKS:
                seeds = sorted(s for (t, c, s, e) in by
                               if (t, c, e) == (task, candidate, epsilon) and (t, HEAD, s, e) in by)
                if not seeds:
                    continue
                head = [100 * by[(task, HEAD, s, epsilon)]["test"]["accuracy"] for s in seeds]
                lpft = [100 * by[(task, candidate, s, epsilon)]["test"]["accuracy"] for s in seeds]
                gain = [a - b for a, b in zip(lpft, head)]
                p_values.append(float(stats.ttest_rel(lpft, head).pvalue) if len(seeds) > 1 and len(set(gain)) > 1
                                else None)
                cells.append((task, epsilon, statistics.mean(gain)))
                rows[candidate].append([task + (" (select)" if task in SELECT_TASKS else ""), f"{epsilon:g}",
                                        ",".join(map(str, seeds)), f"{statistics.mean(head):.1f}",
                                        f"{statistics.mean(lpft):.1f}", " ".join(f"{g:+.1f}" for g in gain),
                                        f"{statistics.mean(gain):+.2f}"])
    flat = [(c, row) for c in reported for row in rows[c]]
    adjusted = {}  # Holm per recipe: each reported candidate's rows are one family of claims
    for candidate in reported:
        tested = [i for i, (c, _) in enumerate(flat) if c == candidate and p_values[i] is not None]
        adjusted |= dict(zip(tested, holm([p_values[i] for i in tested])))
    points = headroom_points(headroom_units or [])
    targets = {c: [] for c in reported}
    for i, ((candidate, row), (task, epsilon, mean_gain)) in enumerate(zip(flat, cells)):
        targets[candidate].append(row[:3] + target_verdicts(epsilon, mean_gain, adjusted.get(i, 1.0) < ALPHA,
                                                            points.get(task)))
        row += ["—", "—"] if i not in adjusted else [f"{p_values[i]:.3g}", f"{adjusted[i]:.3g}"
                                                     + (" *" if adjusted[i] < ALPHA else "")]

    def heading(candidate: str) -> list[str]:  # one table per reported candidate, named when there are two
        if len(reported) < 2:
            return []
        roles = [role for role, name in (("chosen", chosen), ("the default", base.default)) if name == candidate]
        return [f"### `{candidate}` ({', '.join(roles) or 'an earlier default'})", ""]

    if reported:
        text += ["## Report (test accuracy %, whole test split; Holm over each recipe's tested rows)", ""]
        for candidate in reported:
            text += [*heading(candidate),
                     markdown_table(["task", "ε", "seeds", "private head", f"LP-FT `{candidate}`",
                                     "paired gain per seed", "mean gain", "p (paired t, seeds)",
                                     f"Holm-adjusted p (* < {ALPHA})"], rows[candidate]), ""]
    if reported and headroom_units is not None:
        text += ["## Targets", "",
                 f"Per row of the report: the mean gain over the private head against −{FLOOR_TOLERANCE:g} "
                 "points (every task, every ε); the task's non-private headroom (`benchmarks/reports/headroom/"
                 "HEADROOM.md`, LoRA top 2 (the budget) − head, test points, its own seeds) and the share of "
                 f"it the mean gain captures; on headroom tasks (≥ {HEADROOM_POINTS:g} points) the gain "
                 "targets: "
                 + "; ".join(f"ε = {e:g}: ≥ +{g:g}" + (" and Holm-significant" if e == EPSILON else "")
                             + (f" and ≥ {100 * sh:.0f} % of the headroom" if sh is not None else "")
                             for e, (g, sh) in HEADROOM_TARGETS.items())
                 + ". A row of one seed is a single measurement, not a test.", ""]
        for candidate in reported:
            text += [*heading(candidate),
                     markdown_table(["task", "ε", "seeds", f"≥ head − {FLOOR_TOLERANCE:g}", "headroom (points)",
                                     "share captured", "headroom-task target"], targets[candidate]), ""]
    text += ["## Candidates", "", f"Flags as run at ε = {EPSILON:g}; at another ε a candidate's `--head_phase_epsilon` "
             "keeps its share of the budget (`benchmarks/lpft.py`, `arguments`).", "",
             *(f"- `{c}`: `{' '.join(f)}`" for c, f in candidates.items()),
             *(f"- `{c}` (report stage only, a DP-Merging twin for `benchmarks/lpft_merge.py`): `{' '.join(f)}`"
               for c, f in base.twins.items()), ""]
    if base.causal_lm:
        text[-1:-1] = ["", "Every unit also takes `--model_name_or_path <work>/smollm2_base --lora_target_modules "
                       "q_proj,v_proj` (the packaged SmolLM2 as a float32 checkpoint, a sequence classifier)."]
    write_text_atomic(path, "\n".join(text))
    if evidence is not None:
        write_text_atomic(evidence, json.dumps(floor_gap(units), indent=1) + "\n")
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lpft", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", choices=("select", "report"), default="select")
    parser.add_argument("--tasks", default=",".join(PACKAGED_TASKS), help="report stage: the tasks, in order")
    parser.add_argument("--seeds", default="0", help="report stage: the seeds")
    parser.add_argument("--epsilon", type=float, default=EPSILON, help="report stage: the target ε (the candidates' "
                                                                       "ε₁ keep their share of it)")
    parser.add_argument("--candidates", help="these candidates (comma-separated): in the report stage instead of the "
                                             "private head and the chosen one, in the select stage instead of all")
    parser.add_argument("--base", choices=sorted(BASES), default=MINILM.name,
                        help="the base model: the packaged MiniLM (the default's) or SmolLM2 as a sequence "
                             "classifier (its own candidates, units and report)")
    parser.add_argument("--work-dir", type=Path, help="default: runs/lpft (runs/lpft-<base> for another base)")
    parser.add_argument("--units-dir", type=Path, help="default: the base's report folder's units/")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--keep-adapters", type=Path, metavar="DIR",
                        help="keep each LP-FT unit's released adapter in DIR/<unit>/<task>/ (what "
                             "benchmarks/lpft_merge.py merges); the head's units keep none")
    args = parser.parse_args(argv)
    base = BASES[args.base]
    work_dir = (args.work_dir or REPO / "runs" / ("lpft" if base == MINILM else f"lpft-{base.name}")).resolve()
    units_dir = args.units_dir or base.report_dir / "units"
    if not args.report_only:
        named = args.candidates.split(",") if args.candidates else None
        if unknown := sorted(set(named or ()) - set(base.candidates) - set(base.twins)):
            parser.error(f"--candidates: unknown {unknown}; {base.name}'s candidates are {sorted(base.candidates)}"
                         + (f", its report-stage twins {sorted(base.twins)}" if base.twins else ""))
        if args.stage == "select" and (twins := sorted(set(named or ()) & set(base.twins))):
            parser.error(f"--candidates: {twins} run in the report stage only (--stage report); the select stage "
                         f"chooses among {sorted(base.candidates)}")
        if args.stage == "select":
            plan = [(task, c, 0) for c in named or base.candidates for task in SELECT_TASKS]
        else:
            chosen, _ = chosen_candidate(load_units(units_dir), base.candidates)
            if chosen is None and not named:
                parser.error("the select stage is incomplete: run --stage select first, or name --candidates")
            candidates = named or [HEAD, chosen]
            plan = [(task, c, seed) for seed in map(int, args.seeds.split(",")) for task in args.tasks.split(",")
                    for c in candidates]
        for task, candidate, seed in plan:
            epsilon = args.epsilon if args.stage == "report" else EPSILON
            name = unit_name(task, candidate, seed, epsilon)
            path = units_dir / f"{name}.json"
            if path.exists():
                continue
            print(f"[lpft] {base.name} {name}", file=sys.stderr, flush=True)
            if base.causal_lm:
                ensure_smollm2_base(work_dir)
            keep = None if args.keep_adapters is None or candidate == HEAD else args.keep_adapters.resolve()
            run_unit(task, arguments(task, candidate, seed, work_dir / name, epsilon, base), seed, work_dir, path,
                     keep=keep, candidate=candidate, target_epsilon=epsilon)
    # the headroom table was measured on MiniLM: its targets apply to MiniLM's report only
    print(write_report(load_units(units_dir), base.report_dir / "LPFT.md", evidence=base.evidence,
                       headroom_units=harness.stored("headroom", 1) if base == MINILM else None,
                       base=base))
    return 0


if __name__ == "__main__":
    sys.exit(main())
