"""The causal-LM chain at full size, as resumable units on disk: private and non-private SmolLM2 adapters trained on
the whole training split on the cached prefix, their merges and the evaluation (docs/causal-lm.md).

Units, in this order (each skipped when its output exists, so a killed run resumes where it stopped):

1. per task: ``<out>/runs_causal/<task>/`` — ``examples/train_causal_lm.py`` at ε = ``--epsilon`` with ``RECIPE``;
2. the first merge method's merge and evaluation (below), then ``<out>/generation_<m>.json`` — that merge through stock
   ``pipeline("text-generation")``: on a stratified test subset per task, how often its greedy answer is the
   verbaliser that scoring ranks first, and the gold one;
3. per task of ``--nonprivate_tasks``: ``<out>/runs_nonprivate/<task>/`` — the same recipe without DP (``--dp
   false``, no SAM, no alignment), sharing the DP run's cached prefix (``--prefix_cache_dir``);
4. the other merge methods. Per merge method ``m`` of ``--merges``: ``<out>/merged_<m>/`` — ``mergekit-yaml`` of
   ``merge_configs/causal_<m>.yaml`` over the tasks' DP adapters (λ = 1, stated fixed), then its evaluation:
   ``<out>/eval_<m>/results.json`` — ``hf-dpmerge evaluate`` (zero-shot floor, individual, merged) for the first
   method, ``<out>/eval_<m>/merged.json`` — the merged LM alone, scored the same way, for the others (the floor and
   the adapters do not change with the merge);
5. ``<out>/runs_eps<e>/<task>/`` — one more DP adapter at ε = ``--second_epsilon`` for ``--second_epsilon_task``.

Each adapter's ``eval_metrics.json`` holds its score on the whole test split. The report (``--report``) prints
the tables from the stored units and the wall-clock time of each unit.

    python -m benchmarks.causal_runs --out causal-full
    python -m benchmarks.causal_runs --out causal-full --report
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import yaml

from benchmarks.causal import GENERATION_SAMPLES, NON_PRIVATE, generation_scores, run

REPO = Path(__file__).resolve().parent.parent
# Fixed before the full run from the 2000-example pilot (docs/causal-lm.md), not tuned on a validation split:
# LoRA r = 8 on q/v of the top 4 of 30 layers (cached prefix below), 200 steps of expected batch 64.
# DP-SAT + alignment as run (the script's defaults since moved to plain DP-SGD: benchmarks/studies/causal_recipe.py).
RECIPE = ["--lora_layers", "top_4", "--per_device_train_batch_size", "64", "--physical_batch_size", "16",
          "--max_steps", "200", "--learning_rate", "3e-3", "--cache_prefix", "true",
          "--sam_mode", "dp_sat", "--sam_rho", "0.05", "--align_lambda", "0.05", "--logging_steps", "5",
          "--prefix_cache_dir", "prefix_cache"]  # under --out: a task's DP and non-private runs share one prefix


class Units:
    """The run's directory, its tasks and the stored time of every finished unit (``times.json``)."""

    def __init__(self, out: Path, tasks: list[str], sizes: list[str]):
        self.out, self.tasks, self.sizes = out, tasks, sizes
        self.times_path = out / "times.json"
        self.times = json.loads(self.times_path.read_text()) if self.times_path.exists() else {}

    def timed(self, key: str, command: list[str]) -> None:
        self.times[key] = run(command, self.out, self.out / "log.txt")
        self.times_path.write_text(json.dumps(self.times, indent=2))

    def train(self, runs: str, tasks: list[str], extra: list[str]) -> None:
        for task in tasks:
            if (self.out / runs / task / "eval_metrics.json").exists():
                continue
            shutil.rmtree(self.out / runs / task, ignore_errors=True)  # a killed unit starts again
            self.timed(f"{runs}/{task}", [sys.executable, str(REPO / "examples/train_causal_lm.py"), "--task", task,
                                          "--runs_dir", runs, *RECIPE, *extra, *self.sizes])

    def merge_and_evaluate(self, method: str, max_eval_samples: str | None, first: bool) -> None:
        merged, evaluation = self.out / f"merged_{method}", self.out / f"eval_{method}"
        if not (merged / "config.json").exists():
            shutil.rmtree(merged, ignore_errors=True)
            config = yaml.safe_load((REPO / f"merge_configs/causal_{method}.yaml").read_text())
            config["models"] = [{"model": f"./runs_causal/base+./runs_causal/{task}/adapter"} for task in self.tasks]
            (self.out / f"merge_{method}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
            self.timed(f"merge_{method}", ["mergekit-yaml", f"merge_{method}.yaml", merged.name,
                                           "--lora-merge-cache", "runs_causal/lora_cache"])
        sizes = ["--max_eval_samples", max_eval_samples] if max_eval_samples else []
        if first and not (evaluation / "results.json").exists():
            self.timed(f"evaluate_{method}", ["hf-dpmerge", "evaluate", "--runs", "runs_causal", "--merged",
                                              merged.name, "--tasks", ",".join(self.tasks), "--output",
                                              evaluation.name, *sizes])
        elif not first and not (evaluation / "merged.json").exists():
            self.timed(f"evaluate_{method}", [sys.executable, "-m", "benchmarks.causal_runs", "--out", str(self.out),
                                              "--tasks", ",".join(self.tasks), "--score_merged", merged.name,
                                              *sizes])


def score_merged(out: Path, merged_name: str, tasks: list[str], max_eval_samples: str | None) -> None:
    """``<out>/eval_<m>/merged.json``: the merged LM ``<out>/<merged_name>`` scored on each task's test split as
    ``hf-dpmerge evaluate`` scores it (its tokenizer and ``max_length`` from the task's DP record)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_dpmerge.analysis.causal_evaluation import task_score
    from hf_dpmerge.data.load import load_task
    from hf_dpmerge.records.record import PrivacyRecord

    model = AutoModelForCausalLM.from_pretrained(out / merged_name, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(out / "runs_causal" / "base")
    scores = {}
    for task in tasks:
        record = PrivacyRecord.load(out / "runs_causal" / task / "adapter")
        splits, spec = load_task(task, max_eval_samples=int(max_eval_samples) if max_eval_samples else None)
        scores[task] = task_score(model, tokenizer, spec, splits["test"], int(record.extra["max_length"]),
                                  answer_end=record.answer_end_trained)
    target = out / ("eval_" + merged_name.removeprefix("merged_")) / "merged.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(scores, indent=2) + "\n")


def generation_path(out: Path, merged_name: str) -> Path:
    return out / f"generation_{merged_name.removeprefix('merged_')}.json"


def score_generation(out: Path, merged_name: str, tasks: list[str], samples: int) -> None:
    """``<out>/generation_<m>.json``: :func:`generation_scores` of the merged LM ``<out>/merged_<m>`` per task."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_dpmerge.records.record import PrivacyRecord

    tokenizer = AutoTokenizer.from_pretrained(out / merged_name)
    model = AutoModelForCausalLM.from_pretrained(out / merged_name, dtype=torch.float32).eval()
    records = {task: PrivacyRecord.load(out / "runs_causal" / task / "adapter") for task in tasks}
    result = {task: generation_scores(model, tokenizer, task, int(record.extra["max_length"]), samples,
                                      record.answer_end_trained) for task, record in records.items()}
    generation_path(out, merged_name).write_text(json.dumps(result, indent=2) + "\n")


def report(units: Units, merges: list[str], second: str) -> None:
    """Per task: zero-shot floor, DP and non-private adapters, each merge; then every unit's time."""
    def test_score(runs: str, task: str) -> str:
        path = units.out / runs / task / "eval_metrics.json"
        return f"{next(iter(json.loads(path.read_text())['test'].values())):.4f}" if path.exists() else "—"

    evaluations = {m: json.loads((units.out / f"eval_{m}" / "results.json").read_text())
                   for m in merges if (units.out / f"eval_{m}" / "results.json").exists()}
    merged_only = {m: json.loads((units.out / f"eval_{m}" / "merged.json").read_text())
                   for m in merges if (units.out / f"eval_{m}" / "merged.json").exists()}
    print("| task | zero-shot | DP adapter | non-private adapter | " + " | ".join(f"merged ({m})" for m in merges)
          + f" | DP adapter at ε = {second} |")
    print("|---" * (5 + len(merges)) + "|")
    for task in units.tasks:
        rows = {m: e["tasks"].get(task) for m, e in evaluations.items()}
        floor = next((r["floor"] for r in rows.values() if r), None)
        merged = [f"{rows[m]['merged']:.4f}" if rows.get(m) else
                  f"{merged_only[m][task]:.4f}" if task in merged_only.get(m, {}) else "—" for m in merges]
        print(f"| {task} | {'—' if floor is None else f'{floor:.4f}'} | {test_score('runs_causal', task)} | "
              f"{test_score('runs_nonprivate', task)} | {' | '.join(merged)} | "
              f"{test_score(f'runs_eps{second}', task)} |")
    for method in merges:
        if generation_path(units.out, f"merged_{method}").exists():
            for task, row in json.loads(generation_path(units.out, f"merged_{method}").read_text()).items():
                print(f"stock generation of merged_{method}, {task} (n = {row['n']}): the ranked-first verbaliser "
                      f"{row['generation_is_ranked_first']:.3f}, the gold one {row['generation_is_gold']:.3f}, "
                      f"a verbaliser {row['generation_is_a_verbaliser']:.3f}")
    print(json.dumps(units.times, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="causal-full")
    parser.add_argument("--tasks", default="rotten_tomatoes,election_tweets,bbc_news")
    parser.add_argument("--epsilon", default="8")
    parser.add_argument("--merges", default="task_arithmetic,dp,cauchy_poe",
                        help="merge_configs/causal_<name>.yaml to run over the DP adapters, in this order")
    parser.add_argument("--second_epsilon", default="4")
    parser.add_argument("--second_epsilon_task", default="election_tweets")
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--nonprivate_tasks", help="the tasks that get a non-private adapter (default: all)")
    parser.add_argument("--merge_eval_samples", help="score the merges on a seeded stratified test subset of this size")
    parser.add_argument("--score_generation", help="(a unit) stock generation of this merged LM under --out")
    parser.add_argument("--score_merged", help="(a unit) score this merged LM under --out on each task's test split")
    parser.add_argument("--max_train_samples", help="train on a seeded stratified subset of this size (default: all)")
    parser.add_argument("--max_eval_samples", help="score a seeded stratified subset of the test split of this size")
    args = parser.parse_args()
    sizes = [part for name in ("max_train_samples", "max_eval_samples") if getattr(args, name)
             for part in (f"--{name}", getattr(args, name))]
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    units, merges = Units(out, args.tasks.split(","), sizes), args.merges.split(",")
    if args.score_merged:
        score_merged(out, args.score_merged, units.tasks, args.max_eval_samples)
        return
    if args.score_generation:
        score_generation(out, args.score_generation, units.tasks, GENERATION_SAMPLES)
        return
    if not args.report:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
        nonprivate = args.nonprivate_tasks.split(",") if args.nonprivate_tasks else units.tasks
        for task in units.tasks:
            units.train("runs_causal", [task], ["--target_epsilon", args.epsilon])
        units.merge_and_evaluate(merges[0], args.merge_eval_samples or args.max_eval_samples, first=True)
        if not generation_path(out, f"merged_{merges[0]}").exists():
            units.timed("generation", [sys.executable, "-m", "benchmarks.causal_runs", "--out", str(out), "--tasks",
                                       args.tasks, "--score_generation", f"merged_{merges[0]}"])
        units.train("runs_nonprivate", nonprivate, NON_PRIVATE)
        for method in merges[1:]:
            units.merge_and_evaluate(method, args.merge_eval_samples or args.max_eval_samples, first=False)
        units.train(f"runs_eps{args.second_epsilon}", [args.second_epsilon_task],
                    ["--target_epsilon", args.second_epsilon])
    report(units, merges, args.second_epsilon)


if __name__ == "__main__":
    main()
