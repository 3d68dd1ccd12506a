"""Train private LoRA adapters of a causal LM on classification tasks written as instructions, or on prompt →
completion data: the workflow behind ``examples/train_causal_lm.py`` (:func:`shared_causal_base`,
:func:`train_causal_task`, :func:`main`).

Each example is ``prompt → verbaliser`` (:mod:`hf_dpmerge.data.instructions`), the loss on the response tokens only,
one sequence one privacy unit (or ``--privacy_unit_column``); the DP step and its accounting are DPSAMTrainer's.
Every dataset is checked before anything is written (:func:`plan_causal_runs`); one float32 base is saved under
``<runs_dir>/base`` and each task's adapter, record and ``eval_metrics.json`` under ``<runs_dir>/<task>/``.
Flags, own data and outputs: docs/causal-lm.md, docs/workflow.md ("Your own data"); the method: docs/design.md §14.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, NamedTuple

import datasets
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq

from hf_dpmerge.analysis.causal_evaluation import task_score
from hf_dpmerge.data.completions import tokenize_completions
from hf_dpmerge.data.dataset_source import DatasetSource
from hf_dpmerge.data.instructions import IGNORE_INDEX, instruction_format, tokenize_instructions
from hf_dpmerge.data.load import TaskData
from hf_dpmerge.data.model_path import DEFAULT_CAUSAL_HUB_ID, default_causal_gguf
from hf_dpmerge.data.public_prompts import PACKAGED, load_public_prompts, prompts_digest
from hf_dpmerge.data.tasks import DEFAULT_TASK, get_task_spec
from hf_dpmerge.modeling.causal_base import save_causal_base
from hf_dpmerge.records.record import CAUSAL_LM, PROMPT_COMPLETION, PrivacyRecord
from hf_dpmerge.records.release_files import check_release_target
from hf_dpmerge.records.run_folders import ADAPTER_DIR, BASE_DIR, EVAL_METRICS_NAME
from hf_dpmerge.scripts.arguments import DataArguments, LoraArguments
from hf_dpmerge.scripts.data_size import fit_to_data, given_flags
from hf_dpmerge.scripts.train import (
    REFUSED_FLAGS,
    argument_parser,
    load_training_data,
    parse_arguments,
    record_own_dataset,
    resume_point,
    task_sources,
)
from hf_dpmerge.training.cached_prefix import dp_trainer
from hf_dpmerge.training.dpsam_config import DPSAMConfig
from hf_dpmerge.training.lora_causal_lm import lora_causal_lm
from hf_dpmerge.training.public_anchor import anchor_rows
from hf_dpmerge.utils.io import require_model_source, staged_directory

SCRIPT = "train_causal_lm.py"
BASE_MARKER = "hf_dpmerge_base.json"
# The DP recipe for the packaged SmolLM2 at ε = 8, chosen on bbc_news' validation split
# (benchmarks/reports/causal_recipe/CAUSAL_RECIPE.md, docs/causal-lm.md): near full-batch DP gradient descent on the
# cached prefix, LoRA r = 8 on q/v of the top 4 of 30 layers, expected batch 1600, 12 steps, constant AdamW 1e-2,
# C = 1, plain DP-SGD (no SAM, no alignment). Any later flag overrides it.
CAUSAL_DP_DEFAULTS: list[str] = [
    "--lora_layers", "top_4",
    "--per_device_train_batch_size", "1600",
    "--physical_batch_size", "16",
    "--max_steps", "12",
    "--learning_rate", "1e-2",
    "--lr_scheduler_type", "constant",
    "--weight_decay", "0.0",
    "--per_sample_max_grad_norm", "1.0",
    "--sam_mode", "none",
    "--align_lambda", "0",
    "--target_epsilon", "8",
    "--logging_steps", "1",
    "--save_strategy", "no",
    "--report_to", "none",
    "--seed", "0",
]
LABEL_FLAGS = ("label_names", "label_names_from_private_data", "verbalizers", "text_pair_column")


@dataclass
class CausalScriptArguments(LoraArguments, DataArguments):
    """The causal-LM script's flags besides DPSAMConfig's: tasks or own data and base, LoRA, and the run's
    outputs."""

    refused_flags: ClassVar[dict[str, str]] = REFUSED_FLAGS  # what parse_arguments refuses (name → why)

    task: str = field(default=DEFAULT_TASK, metadata={"help": "One task (packaged offline task or a GLUE name)."})
    tasks: str | None = field(default=None, metadata={"help": "Comma-separated tasks, trained one after another."})
    model_name_or_path: str | None = field(default=None, metadata={
        "help": "Base causal LM (Hub id, directory or .gguf file); default: the packaged SmolLM2-135M-Instruct."})
    runs_dir: str = field(default="runs_causal", metadata={"help": "Where base/ and <task>/ are written."})
    max_length: int = field(default=128, metadata={"help": "Prompt + answer length in tokens (the text is cut)."})
    max_train_samples: int | None = field(default=None, metadata={
        "help": "Train on a seeded stratified subset of the training split of this size."})
    max_eval_samples: int | None = field(default=None, metadata={
        "help": "Score a seeded stratified subset of the scored split of this size."})
    eval_split: str = field(default="test", metadata={
        "help": "The split scored after training: test, or validation (a seeded tenth of train) to choose a recipe.",
        "choices": ("test", "validation")})
    eval_batch_size: int = field(default=16, metadata={"help": "Sequences per forward pass when scoring."})
    overwrite: bool = field(default=False, metadata={"help": "Replace adapters already released in <runs_dir>/<task>."})
    lora_target_modules: str = field(default="q_proj,v_proj", metadata={"help": "Comma-separated modules given LoRA."})
    train_answer_end: bool = field(default=True, metadata={
        "help": "Train the end-of-sequence token after each verbaliser; false leaves it out of the loss: the adapter "
                "then never learns to stop, and generated answers run on (docs/causal-lm.md, 'Ending the answer')."})
    anchor_prompts: str | None = field(default=None, metadata={
        "help": "With --anchor_lambda > 0: the public anchor's prompts, 'packaged' (the default) or a file (a JSON "
                "list, or one prompt per line) of public prompts, none from the private data (docs/design.md §14.1)."})
    anchor_max_new_tokens: int = field(default=24, metadata={
        "help": "The longest base answer the public anchor reads, in tokens (it ends earlier at the end of sequence)."})
    verbalizers: str | None = field(default=None, metadata={
        "help": "Own data: each label's answer word, comma-separated in the order of the label names (default: the "
                "label names, with _ . - as spaces); released in the record and the card."})
    prompt_column: str | None = field(default=None, metadata={
        "help": "Own prompt → completion data (no labels): the column holding each prompt (with --completion_column)."})
    completion_column: str | None = field(default=None, metadata={
        "help": "Own prompt → completion data: the column holding the completion the adapter learns to give."})

    def dataset_source(self) -> DatasetSource | None:
        """The own dataset the flags name (with ``--prompt_column``/``--completion_column``: prompt → completion rows,
        no label flags), or None."""
        generative = (self.prompt_column, self.completion_column)
        if generative == (None, None):
            return super().dataset_source()
        if None in generative:
            raise ValueError("--prompt_column and --completion_column go together: give both (prompt → completion "
                             "data), or neither (text and label columns)")
        given = [f"--{flag}" for flag in LABEL_FLAGS if getattr(self, flag) not in (None, False)]
        given += [f"--{flag}" for flag, default in (("text_column", "text"), ("label_column", "label"))
                  if getattr(self, flag) != default]
        if given:
            raise ValueError(f"{given[0]} describes labelled data; prompt → completion data has no labels: drop "
                             f"{given[0]}, or drop --prompt_column/--completion_column")
        source = super().dataset_source()
        if source is None:
            raise ValueError("--prompt_column describes an own dataset: pass --train_file or --dataset_name too")
        return dataclasses.replace(source, prompt_column=self.prompt_column, completion_column=self.completion_column)

    def answer_words(self, own_data: bool) -> tuple[str, ...] | None:
        """``--verbalizers`` as words (None when not given), refused without own data: a packaged task has its own."""
        if self.verbalizers is None:
            return None
        if not own_data:
            raise ValueError("--verbalizers gives an own dataset's answer words (a packaged or GLUE task has its "
                             "own): pass --train_file or --dataset_name too, or drop --verbalizers")
        return tuple(word.strip() for word in self.verbalizers.split(","))

    def public_prompts(self, anchor_lambda: float) -> list[str] | None:
        """The public anchor's prompts when ``anchor_lambda`` > 0, else None (``--anchor_prompts`` refused then)."""
        if anchor_lambda > 0:
            return load_public_prompts(self.anchor_prompts or PACKAGED)
        if self.anchor_prompts is not None:
            raise ValueError("--anchor_prompts is read only by the public anchor: set --anchor_lambda > 0, or drop "
                             "--anchor_prompts")
        return None

    def model_source(self) -> str:
        """The base to load (``--model_name_or_path``, else the packaged GGUF), refused if it is missing."""
        if self.model_name_or_path is None:
            return str(default_causal_gguf())
        if not self.model_name_or_path.endswith(".gguf"):
            require_model_source(self.model_name_or_path)
        elif not Path(self.model_name_or_path).is_file():
            raise FileNotFoundError(f"--model_name_or_path {self.model_name_or_path}: no such GGUF file")
        return self.model_name_or_path

    def base_hub_id(self) -> str | None:
        """The Hub id of the base (for a card's ``base_model``): the packaged model's origin, a Hub id, or None."""
        source = self.model_name_or_path
        if source is None:
            return DEFAULT_CAUSAL_HUB_ID
        return None if Path(source).exists() else source


def shared_causal_base(script: CausalScriptArguments) -> Path:
    """Save the float32 base once; later runs reuse it (and refuse a different source)."""
    source = script.model_source()
    base_dir = Path(script.runs_dir) / BASE_DIR
    marker = base_dir / BASE_MARKER
    if marker.exists():
        saved = json.loads(marker.read_text())
        if saved.get("source") != source or saved.get("model_kind") != CAUSAL_LM:
            kind = saved.get("model_kind", "a sequence classifier")
            raise ValueError(f"{base_dir} was built from {saved.get('source')!r} ({kind}), not the causal LM "
                             f"{source!r}: use another --runs_dir")
        return base_dir
    if base_dir.exists() and any(base_dir.iterdir()):
        raise FileExistsError(f"{base_dir} exists but was not built by this script (no {BASE_MARKER}): "
                              "use another --runs_dir")
    with staged_directory(base_dir) as staged:  # a killed run leaves no half-written base
        save_causal_base(source, staged)
        (staged / BASE_MARKER).write_text(json.dumps({"source": source, "model_kind": CAUSAL_LM}))
    return base_dir


def base_anchor_rows(script: CausalScriptArguments, base_dir: Path, prompts: list[str]) -> datasets.Dataset:
    """The public anchor's rows (the base's greedy answers to ``prompts``), built once per run for every task."""
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    return anchor_rows(base, AutoTokenizer.from_pretrained(base_dir), prompts, script.anchor_max_new_tokens)


def train_causal_task(task: str, task_data: TaskData, script: CausalScriptArguments, config: DPSAMConfig,
                      base_dir: Path, resume: str | bool | None = None, prompts: list[str] | None = None,
                      anchor: datasets.Dataset | None = None) -> dict | None:
    """Train one task on its checked ``task_data`` (``prompts`` and ``anchor``: the public anchor's prompts and rows,
    with ``--anchor_lambda`` > 0); returns its summary on the process that writes the outputs, None on the others."""
    splits, spec = task_data
    unit = config.privacy_unit_column
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    tokenize = tokenize_completions if spec.is_generative else tokenize_instructions
    with config.main_process_first(local=not config.save_on_each_node, desc=f"{task} tokens"):
        train = tokenize(splits["train"], spec, tokenizer, script.max_length,
                         keep_columns=(unit,) if unit is not None else (), train_answer_end=script.train_answer_end)
    # an absolute base path: peft and the privacy record must not hold a path relative to today's directory
    model = lora_causal_lm(base_dir.resolve(), **script.lora_options())
    out = Path(script.runs_dir) / task
    trainer = dp_trainer(model, dataclasses.replace(config, output_dir=str(out / "checkpoints")), train_dataset=train,
                         data_collator=DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX),
                         anchor_rows=anchor, **script.trainer_options())
    trainer.train(resume_from_checkpoint=resume)
    adapter_dir = out / ADAPTER_DIR
    trainer.save_model(str(adapter_dir), overwrite=script.overwrite)
    if not config.should_save:
        return None
    record = PrivacyRecord.load(adapter_dir)
    record.task = task
    record_own_dataset(spec, out, record)
    record.extra.update(model_kind=CAUSAL_LM, label_names=list(spec.label_names),
                        verbalisers=[] if spec.is_generative else list(instruction_format(spec).verbalisers),
                        **({"task_kind": PROMPT_COMPLETION} if spec.is_generative else {}),
                        max_length=script.max_length,
                        train_answer_end=script.train_answer_end,
                        base_model_hub_id=script.base_hub_id(), base_model_source=Path(script.model_source()).name)
    if prompts is not None:  # what the anchor read, named without a path of this machine
        record.extra["public_anchor"].update(
            prompts=PACKAGED if script.anchor_prompts in (None, PACKAGED) else "a file of the user's",
            prompts_sha256=prompts_digest(prompts), max_new_tokens=script.anchor_max_new_tokens,
            answer_tokens=sum(label != IGNORE_INDEX for row in anchor["labels"] for label in row))
    record.save(adapter_dir)
    score = task_score(trainer.model.eval(), tokenizer, spec, splits[script.eval_split], script.max_length,
                       script.eval_batch_size, answer_end=script.train_answer_end)
    summary = {"task": task, script.eval_split: {spec.metric: score}, "epsilon": record.epsilon, "delta": record.delta,
               "privacy_unit": record.privacy_unit, "steps": record.steps, "num_samples": record.num_samples,
               "num_units": record.num_units}
    (out / EVAL_METRICS_NAME).write_text(json.dumps(summary, indent=2) + "\n")
    scoring = ("completion tokens, teacher-forced" if spec.is_generative else "verbaliser scoring") + (
        "" if script.train_answer_end else ", the answer's end left out")
    print(f"[{task}] {script.eval_split} {spec.metric} = {score:.4f} ({scoring}), ε = {record.epsilon:.3g}, "
          f"δ = {record.delta:.3g}, per {record.privacy_unit} ({record.num_units} units)")
    return summary


class CausalPlan(NamedTuple):
    """The parsed flags, every task's checked data (its spec with the answer words it trains) and the flags it trains
    with (``configs``: ``config`` with the expected batch and steps fitted to its size)."""

    script: CausalScriptArguments
    config: DPSAMConfig
    data: dict[str, TaskData]
    configs: dict[str, DPSAMConfig]


def plan_causal_runs(argv: list[str]) -> CausalPlan:
    """Parse ``argv`` (after :data:`CAUSAL_DP_DEFAULTS`), then check every release target and load and check every
    task's data (as ``examples/train_glue.py`` does), its instruction format (a regression task, answer words that
    do not fit its labels) and its expected batch: nothing is written."""
    script, config = parse_arguments(argv, CausalScriptArguments, CAUSAL_DP_DEFAULTS, SCRIPT)
    given = given_flags(argument_parser(CausalScriptArguments, CAUSAL_DP_DEFAULTS), argv)
    sources = task_sources(script, given)
    words = script.answer_words(own_data=None not in sources.values())
    resume_point(config, list(sources))
    for task in sources:  # refuse to replace a release before training anything, not after
        check_release_target(Path(script.runs_dir) / task / ADAPTER_DIR, script.overwrite)
    for task in (task for task, source in sources.items() if source is None):  # a regression task, before loading
        instruction_format(get_task_spec(task))
    data, configs = {}, {}
    for task, source in sources.items():
        splits, spec = load_training_data(task, source, config, max_train_samples=script.max_train_samples,
                                          max_eval_samples=script.max_eval_samples)
        spec = spec if words is None else dataclasses.replace(spec, verbalisers=words)
        if not spec.is_generative:
            instruction_format(spec)  # an own task's answer words against its labels
        configs[task] = fit_to_data(task, script, config, splits["train"], given, head_phase=False,
                                    max_sample_rate=1.0)[1]
        data[task] = TaskData(splits, spec)
    return CausalPlan(script, config, data, configs)


def main(argv: list[str] | None = None) -> None:
    """Train every task of ``argv`` (default: the command line) from one shared causal-LM base, once every task's
    data is checked (:func:`plan_causal_runs`)."""
    script, config, data, configs = plan_causal_runs(list(sys.argv[1:] if argv is None else argv))
    prompts = script.public_prompts(config.anchor_lambda)  # refused before any training
    resume = resume_point(config, list(data))
    with config.main_process_first(local=not config.save_on_each_node, desc="shared base"):
        base_dir = shared_causal_base(script)
    anchor = None if prompts is None else base_anchor_rows(script, base_dir, prompts)
    for task, task_data in data.items():
        train_causal_task(task, task_data, script, configs[task], base_dir, resume, prompts, anchor)
    config.distributed_state.wait_for_everyone()
    config.distributed_state.destroy_process_group()


if __name__ == "__main__":
    from hf_dpmerge.utils.user_errors import run_script

    run_script(main)
