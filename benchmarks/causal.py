"""What the SmolLM2 benchmarks share: a logged subprocess; the adapters the causal_recipe study kept; the packaged
causal merge configs, a merge and verbaliser scoring on each task's test rows; stock generation scored against
verbaliser scoring (of a merged model, or of one kept adapter folded into the base by stock peft)."""

from __future__ import annotations

import argparse
import gc
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.merging import DATA_FREE_CONFIGS, packaged_config

REPO = Path(__file__).resolve().parent.parent
GENERATION_SAMPLES = 200
NON_PRIVATE = ["--dp", "false", "--sam_mode", "none", "--align_lambda", "0"]
CONFIGS = {"task_arithmetic": "causal_task_arithmetic.yaml", "ties": "causal_ties.yaml", "dp_aware": "causal_dp.yaml",
           "cauchy_poe": "causal_cauchy_poe.yaml"}
DATA_FREE = tuple(name for name in DATA_FREE_CONFIGS if name != "emr")
"""The encoder's packaged data-free configs a causal merge takes as they are: their parameters name no model. Not
``emr``: its per-task modulated models are not the one merged LM these studies score."""


def run(command: list[str], cwd: Path, log: Path) -> float:
    start = time.perf_counter()
    with log.open("a") as stream:
        stream.write(f"$ {' '.join(command)}\n")
        stream.flush()
        subprocess.run(command, cwd=cwd, stdout=stream, stderr=subprocess.STDOUT, check=True)
    return time.perf_counter() - start


def add_kept_arguments(parser: argparse.ArgumentParser) -> None:
    """``--kept`` and ``--base``: the causal_recipe study's kept adapters and the base they trained on."""
    parser.add_argument("--kept", type=Path, default=REPO / "runs" / "causal_recipe" / "kept",
                        help="the causal_recipe study's kept adapters (its <work-dir>/kept)")
    parser.add_argument("--base", type=Path, default=REPO / "runs" / "causal_recipe" / "runs_causal" / "base",
                        help="the base the kept adapters trained on (the causal script's <runs_dir>/base)")


def kept_runs(kept: Path) -> dict[tuple[str, str, float, int], Path]:
    """(task, candidate, ε, seed) → the run folder (``adapter/`` inside) the causal_recipe study kept under ``kept``
    for its test unit, read from that study's stored units."""
    from benchmarks import harness

    found = {}
    for unit in harness.stored("causal_recipe", 1):
        s = unit["settings"]
        run = kept / unit["name"] / s["task"]
        if (s["stage"], s["split"]) == ("train", "test") and (run / "adapter").is_dir():
            found[(s["task"], s["candidate"], s["epsilon"], s["seed"])] = run
    return found


def leading_verbaliser(answer: str, verbalisers: list[str]) -> int | None:
    """The index of the longest verbaliser that ``answer`` begins with as a whole word (``"Trump."``,
    ``"Trump is"``: Trump; ``"Trumpet"``: none), or None: what a reader takes from an answer that goes on."""
    fits = [k for k, v in enumerate(verbalisers)
            if answer.startswith(v) and (len(answer) == len(v) or not answer[len(v)].isalnum())]
    return max(fits, key=lambda k: len(verbalisers[k]), default=None)


def generation_scores(model, tokenizer, task: str, max_length: int, samples: int, answer_end: bool = True) -> dict:
    """``model``'s greedy stock ``pipeline("text-generation")`` answers on ``samples`` stratified test examples of
    ``task`` asked as chat messages (:func:`~hf_dpmerge.data.instructions.instruction_messages`): the share where
    the answer is the verbaliser that verbaliser scoring ranks first, the gold one, and any verbaliser; the share
    where it begins with the gold verbaliser, and with any (:func:`leading_verbaliser`: an adapter trained without
    the answer's end goes on after it); and, at the answer's first position (the chat as the pipeline renders it),
    the share where the end-of-sequence token (the trained end of every answer) is the greedy choice, i.e. the
    answer is empty, and its mean log-probability. ``answer_end``: whether the ranking scores the end after each
    verbaliser (false for an adapter trained without it)."""
    import numpy as np
    import torch
    from transformers import pipeline

    from hf_dpmerge.data.instructions import InstructionEncoder, instruction_messages, verbaliser_choices
    from hf_dpmerge.data.load import load_task
    from hf_dpmerge.modeling.verbaliser_scoring import verbaliser_predictions

    generate = pipeline("text-generation", model=model, tokenizer=tokenizer)
    splits, spec = load_task(task, max_eval_samples=samples)
    test = splits["test"]
    prompts, responses = verbaliser_choices(test, spec, tokenizer, max_length, answer_end=answer_end)
    verbalisers = [tokenizer.decode(r, skip_special_tokens=True).strip() for r in responses]
    ranked = verbaliser_predictions(model, prompts, responses, pad_token_id=tokenizer.pad_token_id or 0)
    chats = [instruction_messages(spec, [row[c] for c in spec.text_columns]) for row in test]
    longest_answer = max(map(len, InstructionEncoder(spec, tokenizer, max_length).responses))  # its end included
    outputs = generate(chats, max_new_tokens=longest_answer, do_sample=False, return_full_text=False)
    answers = [o[0]["generated_text"].strip() for o in outputs]
    first = []
    with torch.no_grad():
        for chat in chats:
            ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True, return_tensors="pt")
            first.append(model(**ids.to(model.device)).logits[0, -1].log_softmax(-1).cpu())
    end = tokenizer.eos_token_id
    leading = [leading_verbaliser(a, verbalisers) for a in answers]
    return {"n": len(answers),
            "end_of_sequence_first": float(np.mean([int(f.argmax()) == end for f in first])),
            "end_of_sequence_first_logprob": float(np.mean([float(f[end]) for f in first])),
            "generation_is_ranked_first": float(np.mean([a == verbalisers[k] for a, k in zip(answers, ranked)])),
            "generation_is_gold": float(np.mean([a == verbalisers[y] for a, y in zip(answers, test["label"])])),
            "generation_is_a_verbaliser": float(np.mean([a in verbalisers for a in answers])),
            "generation_begins_with_gold": float(np.mean([k == y for k, y in zip(leading, test["label"])])),
            "generation_begins_with_a_verbaliser": float(np.mean([k is not None for k in leading])),
            "examples": [{"answer": a, "gold": verbalisers[y]} for a, y in list(zip(answers, test["label"]))[:5]]}


def merged_generation(merged: Path, runs: Path, tasks: list[str]) -> dict:
    """Per task, :func:`generation_scores` of the merged LM ``merged`` (each task's run in ``runs`` gives its
    ``max_length`` and whether its answer's end was trained)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_dpmerge.records.record import PrivacyRecord

    model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(merged)
    records = {task: PrivacyRecord.load(runs / task / "adapter") for task in tasks}
    return {task: generation_scores(model, tokenizer, task, int(record.extra["max_length"]), GENERATION_SAMPLES,
                                    record.answer_end_trained) for task, record in records.items()}


def score_kept_generation(work_dir: Path, kept: Path) -> dict:
    """:func:`generation_scores` of the kept adapter ``kept/<task>/adapter``, merged into
    the base by stock peft."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_dpmerge.records.record import PrivacyRecord

    (task_dir,) = [d for d in kept.iterdir() if (d / "adapter").is_dir()]
    base = work_dir / "runs_causal" / "base"
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                                      task_dir / "adapter").merge_and_unload().eval()
    record = PrivacyRecord.load(task_dir / "adapter")
    scores = generation_scores(model, AutoTokenizer.from_pretrained(base), task_dir.name,
                               int(record.extra["max_length"]), GENERATION_SAMPLES, record.answer_end_trained)
    return {"unit": kept.name, "task": task_dir.name, **scores}


def causal_config(merge: str) -> dict:
    """``merge``'s packaged config: its causal one (:data:`CONFIGS`), else the encoder's data-free one
    (:data:`DATA_FREE`)."""
    import yaml

    if merge in CONFIGS:
        return yaml.safe_load((REPO / "merge_configs" / CONFIGS[merge]).read_text())
    if merge not in DATA_FREE:
        raise KeyError(f"{merge}: not a causal merge ({', '.join((*CONFIGS, *DATA_FREE))})")
    return packaged_config(merge)


def causal_parameters(merge: str) -> dict | None:
    """The parameters of ``merge``'s packaged config (:func:`causal_config`)."""
    return causal_config(merge).get("parameters")


def merge_config(merge: str, runs: Path, tasks: list[str], parameters: dict | None) -> dict:
    """A mergekit config of ``merge``'s method with ``parameters`` over ``runs``' base and task adapters."""
    from hf_dpmerge.merging.merge_config import lora_reference, mergekit_config

    return mergekit_config(causal_config(merge)["merge_method"], runs / "base",
                           [lora_reference(runs / "base", runs / task / "adapter") for task in tasks],
                           parameters=parameters)


def scores(runs: Path, tasks: list[str], max_eval_samples: int, model_dir: Path | None = None) -> dict:
    """Each task's accuracy and row count: of ``model_dir`` (a plain causal LM), or, when None, of the base with
    the task's own adapter (``runs/<task>/adapter``)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_dpmerge.analysis.causal_evaluation import task_score
    from hf_dpmerge.analysis.task_run import task_rows, task_runs

    tokenizer = AutoTokenizer.from_pretrained(runs / "base")
    shared = None if model_dir is None else AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    result = {}
    for run in task_runs(runs, tasks):
        model = shared or PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(runs / "base", dtype=torch.float32), run.adapter_dir)
        rows = task_rows(run, "test", max_samples=max_eval_samples)
        result[run.task] = {"accuracy": task_score(model.eval(), tokenizer, run.spec, rows, run.max_length,
                                                   answer_end=run.record.answer_end_trained),
                            "num_examples": len(rows)}
        del model
        gc.collect()
    return result


@contextmanager
def merged_by(method: str, runs: Path, tasks: list[str], cell: Path, parameters: dict | None) -> Iterator[Path]:
    """The tasks' adapters merged by ``method`` with ``parameters`` into ``cell/merged/<method>``, deleted on exit."""
    from benchmarks.merging import run_merge

    merged = cell / "merged" / method
    run_merge(merge_config(method, runs, tasks, parameters), cell / f"{method}.yaml", merged, cell / "lora_cache")
    try:
        yield merged
    finally:
        shutil.rmtree(merged, ignore_errors=True)
