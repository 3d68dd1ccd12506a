"""The causal-LM chain at full size: private and non-private SmolLM2 adapters trained on the whole training split on
the cached prefix, their merges and the evaluation (docs/causal-lm.md, "The full run").

Units, in order (training runs, merged models and the prefix cache stay under ``--work-dir``): per task
``train-runs_causal-<task>`` (``examples/train_causal_lm.py`` at ε = ``--epsilon`` with :data:`RECIPE`);
``merge-<m>`` of the first method (evaluate's floor / individual / merged, and stock ``pipeline("text-generation")``
of the merged LM); per task of ``--nonprivate_tasks`` ``train-runs_nonprivate-<task>`` (no DP, the DP run's
cached prefix); ``merge-<m>`` of the other methods; ``train-runs_eps<e>-<task>`` at ``--second_epsilon``.
Report ``benchmarks/reports/causal_full/CAUSAL_FULL.md``.

    python -m benchmarks.studies.causal_full --nonprivate_tasks election_tweets,bbc_news --merge_eval_samples 500
    python -m benchmarks.studies.causal_full --report-only
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.causal import CONFIGS, NON_PRIVATE, causal_parameters, merged_by, merged_generation, run, scores
from benchmarks.harness import REPO, Unit, listed
from benchmarks.markdown import table

# Fixed before the full run from the 2000-example pilot (docs/causal-lm.md), not tuned on a validation split:
# LoRA r = 8 on q/v of the top 4 of 30 layers (cached prefix below), 200 steps of expected batch 64.
# DP-SAT + alignment as run (the script's defaults since moved to plain DP-SGD: benchmarks/studies/causal_recipe.py).
RECIPE = ["--lora_layers", "top_4", "--per_device_train_batch_size", "64", "--physical_batch_size", "16",
          "--max_steps", "200", "--learning_rate", "3e-3", "--cache_prefix", "true",
          "--sam_mode", "dp_sat", "--sam_rho", "0.05", "--align_lambda", "0.05", "--logging_steps", "5",
          "--prefix_cache_dir", "prefix_cache"]  # under the work folder: a task's DP and non-private runs share it


class CausalFull(harness.Study, name="causal_full", schema=1):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--tasks", default="rotten_tomatoes,election_tweets,bbc_news")
        parser.add_argument("--epsilon", default="8")
        parser.add_argument("--merges", default="task_arithmetic,dp_aware,cauchy_poe",
                            help=f"merge methods over the DP adapters, in this order, of {list(CONFIGS)}")
        parser.add_argument("--second_epsilon", default="4")
        parser.add_argument("--second_epsilon_task", default="election_tweets")
        parser.add_argument("--nonprivate_tasks", help="the tasks that get a non-private adapter (default: all)")
        parser.add_argument("--merge_eval_samples", help="score the merges on a seeded stratified test subset")
        parser.add_argument("--max_train_samples", help="train on a seeded stratified subset (default: all)")
        parser.add_argument("--max_eval_samples", help="score a seeded stratified subset of the test split")

    def plan(self, args: argparse.Namespace) -> list[Unit]:
        tasks, merges = args.tasks.split(","), listed(args.merges, list(CONFIGS), "--merges")
        sizes = [part for name in ("max_train_samples", "max_eval_samples") if getattr(args, name)
                 for part in (f"--{name}", getattr(args, name))]

        def train(runs: str, task: str, extra: list[str]) -> Unit:
            return Unit(f"train-{runs}-{task}", {"stage": "train", "runs": runs, "task": task,
                                                 "flags": [*RECIPE, *extra, *sizes]})

        def merge(method: str, first: bool) -> Unit:
            return Unit(f"merge-{method}", {"stage": "merge", "method": method, "tasks": tasks, "first": first,
                                            "parameters": causal_parameters(method),
                                            "max_eval_samples": args.merge_eval_samples or args.max_eval_samples})

        nonprivate = args.nonprivate_tasks.split(",") if args.nonprivate_tasks else tasks
        return [*(train("runs_causal", t, ["--target_epsilon", args.epsilon]) for t in tasks), merge(merges[0], True),
                *(train("runs_nonprivate", t, NON_PRIVATE) for t in nonprivate),
                *(merge(m, False) for m in merges[1:]),
                train(f"runs_eps{args.second_epsilon}", args.second_epsilon_task,
                      ["--target_epsilon", args.second_epsilon])]

    def run(self, unit: Unit, work_dir: Path) -> dict[str, Any]:
        s = unit.settings
        work_dir.mkdir(parents=True, exist_ok=True)
        if s["stage"] == "train":
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
            shutil.rmtree(work_dir / s["runs"] / s["task"], ignore_errors=True)  # a killed unit starts again
            run([sys.executable, str(REPO / "examples/train_causal_lm.py"), "--task", s["task"], "--runs_dir",
                 s["runs"], *s["flags"]], work_dir, work_dir / "log.txt")
            return json.loads((work_dir / s["runs"] / s["task"] / "eval_metrics.json").read_text())
        runs, samples = work_dir / "runs_causal", s["max_eval_samples"]
        with merged_by(s["method"], runs, s["tasks"], work_dir, s["parameters"]) as merged:
            if not s["first"]:
                return {"merged": {t: v["accuracy"] for t, v in scores(runs, s["tasks"], int(samples or 0) or None,
                                                                       merged).items()}}
            from hf_dpmerge.cli.main import main as hf_dpmerge

            evaluation = work_dir / f"eval_{s['method']}"
            code = hf_dpmerge(["evaluate", "--runs", str(runs), "--merged", str(merged), "--tasks",
                               ",".join(s["tasks"]), "--output", str(evaluation),
                               *(["--max_eval_samples", samples] if samples else [])])
            if code != 0:
                raise RuntimeError(f"hf-dpmerge evaluate ({unit.name}) failed with exit status {code}")
            return {"evaluation": json.loads((evaluation / "results.json").read_text()),
                    "generation": merged_generation(merged, runs, s["tasks"])}

    def report(self, stored: list[dict[str, Any]]) -> dict[str, str]:
        """Per task: zero-shot floor, DP and non-private adapters, each merge; stock generation; each unit's time."""
        trained = {(u["settings"]["runs"], u["settings"]["task"]): u["result"] for u in stored
                   if u["settings"]["stage"] == "train"}
        merges = {u["settings"]["method"]: u["result"] for u in stored if u["settings"]["stage"] == "merge"}
        tasks = list(dict.fromkeys([*(t for u in stored for t in u["settings"].get("tasks", ())),
                                    *(t for (_, t) in trained)]))
        second = sorted({r for (r, _) in trained if r.startswith("runs_eps")})

        def test(runs: str, task: str) -> str:
            result = trained.get((runs, task))
            return "—" if result is None else f"{next(iter(result['test'].values())):.4f}"

        def merged(method: str, task: str) -> str:
            result = merges[method]
            score = (result["evaluation"]["tasks"].get(task, {}).get("merged") if "evaluation" in result
                     else result["merged"].get(task))
            return "—" if score is None else f"{score:.4f}"

        floors = {t: r["floor"] for m in merges.values() for t, r in m.get("evaluation", {}).get("tasks", {}).items()}
        rows = [[task, f"{floors[task]:.4f}" if task in floors else "—", test("runs_causal", task),
                 test("runs_nonprivate", task), *(merged(m, task) for m in merges), *(test(r, task) for r in second)]
                for task in tasks]
        header = ["task", "zero-shot", "DP adapter", "non-private adapter", *(f"merged ({m})" for m in merges),
                  *(f"DP adapter at ε = {r.removeprefix('runs_eps')}" for r in second)]
        generation = [[f"merged ({m})", task, str(g["n"]), *(f"{g[k]:.3f}" for k in (
            "generation_is_ranked_first", "generation_is_gold", "generation_is_a_verbaliser"))]
            for m, result in merges.items() for task, g in result.get("generation", {}).items()]
        times = [[u["name"], "—" if "seconds" not in u["result"] else f"{u['result']['seconds'] / 60:.1f}"]
                 for u in stored]
        return {"CAUSAL_FULL.md": "\n".join([
            "# The causal-LM chain at full size (SmolLM2)", "",
            f"Generated by `python -m benchmarks.studies.causal_full --report-only` from {len(stored)} stored units. "
            "Accuracy: each adapter on its whole test split; the floor and the merges as the merge units scored them "
            "(`max_eval_samples` of their settings).", "", table(header, rows), "",
            "## Stock generation of the merged LM", "",
            table(["model", "task", "n", "the ranked-first verbaliser", "the gold one", "a verbaliser"], generation),
            "", "## Units", "", table(["unit", "minutes"], times), ""])}


if __name__ == "__main__":
    sys.exit(harness.main(CausalFull()))
