"""Train private LoRA adapters on text-classification tasks (by default private LP-FT: the private head, then
DP-SGD LoRA on the top layers from it; ``--lora_recipe one_phase``: DP-SGD + DP-SAT + drift alignment in one
phase): the workflow behind ``examples/train_glue.py`` (:func:`shared_base`, :func:`train_task`, :func:`main`).

    accelerate launch examples/train_glue.py --tasks rotten_tomatoes,election_tweets,reuters_r8,bbc_news
    accelerate launch examples/train_glue.py --train_file notes.csv --label_names neg,pos    # your own data

Every TrainingArguments / DPSAMConfig field is a flag, honoured or refused (:data:`TRAIN_GLUE_REFUSED_FLAGS`;
docs/bad-inputs.md). All adapters start from one base saved once under ``<runs_dir>/base``; per task
``<runs_dir>/<task>/`` gets ``adapter/`` (LoRA, head, ``dp_privacy.json``, its base for stock loaders),
``encoder_adapter/`` (LoRA only: what is merged) and ``eval_metrics.json``. ``--privacy_unit_column`` makes a unit
the privacy unit (docs/privacy.md); under ``accelerate launch`` only the main process writes. See docs/workflow.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, NamedTuple, NoReturn

import torch
from transformers import (
    AutoTokenizer,
    DataCollatorWithPadding,
    HfArgumentParser,
)

from hf_dpmerge.data import compute_metrics, load_task, predictions_from_logits, tokenize_task
from hf_dpmerge.data.dataset_source import LABELS_FROM_PRIVATE_DATA, DatasetSource
from hf_dpmerge.data.glue import GLUE_PATH
from hf_dpmerge.data.load import TaskData
from hf_dpmerge.data.metrics import trainer_compute_metrics
from hf_dpmerge.data.model_path import source_hub_id
from hf_dpmerge.data.tasks import GLUE, TaskSpec, parse_task_list
from hf_dpmerge.modeling import load_sequence_classifier
from hf_dpmerge.modeling.pooled_features import task_head
from hf_dpmerge.modeling.stock_release import SHARED_ENCODER_FILE, make_adapter_stock_loadable
from hf_dpmerge.records.card import write_adapter_card
from hf_dpmerge.records.record import PrivacyRecord
from hf_dpmerge.records.release_files import check_release_target
from hf_dpmerge.records.run_folders import ADAPTER_DIR, BASE_DIR, ENCODER_ADAPTER_DIR, EVAL_METRICS_NAME
from hf_dpmerge.scripts.arguments import DataArguments, LoraArguments, TaskArguments
from hf_dpmerge.scripts.data_size import fit_to_data, given_flags
from hf_dpmerge.scripts.help_groups import group_flags
from hf_dpmerge.training.cached_prefix import dp_trainer
from hf_dpmerge.training.dp.state import last_complete_checkpoint
from hf_dpmerge.training.dpsam_config import DPSAMConfig
from hf_dpmerge.training.encoder_adapter import export_encoder_adapter
from hf_dpmerge.training.lora_classifier import lora_sequence_classifier
from hf_dpmerge.training.recipe import (
    DP_RECIPE,
    HEAD_ONLY_RECIPE,
    LORA_RECIPE,
    LPFT_RECIPE,
    ONE_PHASE_RECIPE,
    recipe_value,
)
from hf_dpmerge.utils.adapter_files import ADAPTER_BASE_DIR
from hf_dpmerge.utils.io import staged_directory
from hf_dpmerge.utils.quiet import transformers_errors_only

# The tuned DP recipe first; prediction keeps no per-sample gradients: large evaluation batches (Trainer's is 8).
# LoRA adapters: private LP-FT (LPFT_RECIPE) on top of the one-phase FFA-LoRA recipe (LORA_RECIPE)
DP_DEFAULTS = [*DP_RECIPE, "--per_device_eval_batch_size", "128", *LORA_RECIPE, *LPFT_RECIPE]
# --lora_recipe one_phase: LPFT_RECIPE undone, the LoRA default until LP-FT (what earlier measurements ran)
ONE_PHASE_DEFAULTS = [*DP_DEFAULTS, *ONE_PHASE_RECIPE]
# --train_lora false: no LoRA factors to freeze or warm up before (LORA_RECIPE undone), then the head-only recipe
HEAD_ONLY_DEFAULTS = [*DP_RECIPE, "--per_device_eval_batch_size", "128", "--lora_freeze_a", "false",
                      "--head_warmup_steps", "0", *HEAD_ONLY_RECIPE]
HUB_FLAG = "a release goes to the Hub with its privacy card through `hf-dpmerge push`"
# TrainingArguments flags this script cannot honour as Trainer would, and what to use instead (docs/bad-inputs.md)
REFUSED_FLAGS = {
    "output_dir": "each task writes to <runs_dir>/<task>/ (checkpoints in <runs_dir>/<task>/checkpoints): "
                  "use --runs_dir",
    **{name: HUB_FLAG for name in ("push_to_hub", "hub_model_id", "hub_token", "hub_private_repo", "hub_strategy",
                                   "hub_always_push", "hub_revision")},
    "do_eval": "the script always trains, scores the test split after training (eval_metrics.json) and "
               "evaluates the validation split during training with --eval_strategy",
    "prediction_loss_only": "the script scores the test split from its predictions",
    "eval_do_concat_batches": "the script's metrics take the whole split's predictions at once",
    "batch_eval_metrics": "the script's metrics take the whole split's predictions at once",
    "include_for_metrics": "the script's metrics use the predictions and labels only",
}
TRAIN_GLUE_REFUSED_FLAGS = {
    **REFUSED_FLAGS,
    "anchor_lambda": "the public anchor holds a causal LM's answers (examples/train_causal_lm.py); a sequence "
                     "classifier has none to hold",
}
"""train_glue.py's refused flags: :data:`REFUSED_FLAGS` (every training script's) and the causal LM's own."""


def recipe_defaults(parser: HfArgumentParser, argv: list[str], defaults: list[str] = DP_DEFAULTS) -> list[str]:
    """The defaults put before ``argv``: for the classifier script's recipes (:data:`DP_DEFAULTS`,
    :data:`ONE_PHASE_DEFAULTS`), the head-only recipe with ``--train_lora false`` and the one-phase one with
    ``--lora_recipe one_phase``; else ``defaults`` as given (another script's recipe)."""
    if defaults is not DP_DEFAULTS and defaults is not ONE_PHASE_DEFAULTS:
        return defaults
    given = parser.parse_known_args([*defaults, *argv])[0]
    if not given.train_lora:
        return HEAD_ONLY_DEFAULTS
    return ONE_PHASE_DEFAULTS if given.lora_recipe == "one_phase" else defaults


def refuse_ignored_flags(parser: HfArgumentParser, argv: list[str], defaults: list[str], script: str,
                         refused: dict[str, str]) -> None:
    """Refuse a non-default value of a flag of ``refused`` (name → why) instead of silently ignoring it (the
    values as parsed, before DPSAMConfig checks combinations)."""
    defaults = recipe_defaults(parser, argv, defaults)
    given = vars(parser.parse_known_args([*defaults, *argv])[0])  # an unknown flag: refused by the full parse
    default = vars(parser.parse_known_args(defaults)[0])
    for name, why in refused.items():
        if given[name] != default[name]:
            raise ValueError(f"--{name} is not used by {script}: {why}")


def refuse_non_private_step_flags(config: DPSAMConfig, script: str = "train_glue.py") -> None:
    """With ``--no_dp`` DPSAMTrainer ignores the flags its step does not implement (under DP DPSAMConfig refuses
    them); the script refuses them in both cases."""
    if not config.dp and (problems := config.step_problems()):
        raise ValueError(f"{script} --no_dp: " + "; ".join(problems))


def resume_point(config: DPSAMConfig, tasks: list[str]) -> str | bool | None:
    """``--resume_from_checkpoint``: ``true`` resumes every task from its last complete checkpoint; a path
    names one checkpoint, so it needs a single task."""
    value = config.resume_from_checkpoint
    if value is None or str(value).lower() in ("false", "no", ""):
        return None
    if str(value).lower() in ("true", "yes", "last"):
        return True
    if len(tasks) != 1:
        raise ValueError(f"--resume_from_checkpoint {value} names one checkpoint but {len(tasks)} tasks are "
                         "trained: pass --resume_from_checkpoint true (each task's last checkpoint) or one --task")
    return str(value)


def glue_dataset_hub_id(spec, dataset_path: str | None) -> str | None:
    """The Hub dataset a GLUE task trained on (``--dataset_path`` when it is no local directory); None for the
    packaged offline tasks, whose Hub copies (if any) are not the same data."""
    import os

    if spec.source != GLUE:
        return None
    path = dataset_path or GLUE_PATH
    return None if os.path.isdir(path) else path


@dataclass
class TrainArguments:
    tasks: str | None = field(default=None, metadata={"help": "Comma-separated tasks, trained one after another."})
    runs_dir: str = field(default="runs", metadata={"help": "Where base/ and <task>/ are written."})
    max_eval_samples: int | None = field(default=None)
    base_seed: int = field(default=0, metadata={"help": "Seed of the shared base's (unused) head initialisation."})
    overwrite: bool = field(default=False, metadata={"help": "Replace adapters already released in <runs_dir>/<task>."})
    train_lora: bool = field(default=True, metadata={
        "help": "false: freeze the LoRA factors at B = 0 (the encoder is the base's) and train the task head only, "
                "the 'base encoder + own head' floor; under DP the head is the accounted release as usual."})
    head_phase_epsilon: float | None = field(default=None, metadata={
        "help": "Private LP-FT (docs/design.md §15.6): first train the head alone on cached pooled features (the "
                "floor's recipe) at this ε, then LoRA and the head from there (B = 0: the same model at the start); "
                "both phases compose in one accountant to --target_epsilon, stated in dp_privacy.json."})
    lora_recipe: str = field(default="lp_ft", metadata={
        "help": "The LoRA defaults put before the other flags: 'lp_ft' (private LP-FT, LPFT_RECIPE) or 'one_phase' "
                "(the one-phase FFA-LoRA recipe before it, ONE_PHASE_RECIPE); any flag given overrides either.",
        "choices": ("lp_ft", "one_phase")})
    head_phase_share: float = field(default=0.0, metadata={
        "help": "Private LP-FT with ε₁ = this share of --target_epsilon (0 < share < 1; 0: no head phase), under DP "
                "for LoRA adapters; --head_phase_epsilon, when given, sets ε₁ instead. With --no_dp, a share > 0 "
                "runs the same head phase unnoised (the recipe's non-private twin); --train_lora false has none."})
    head_phase_steps: int = field(default=int(recipe_value(HEAD_ONLY_RECIPE, "--max_steps")), metadata={
        "help": "Steps of the LP-FT head phase (capped by the command line's --max_steps, when given)."})
    head_phase_batch_size: int = field(default=int(recipe_value(HEAD_ONLY_RECIPE, "--per_device_train_batch_size")),
                                       metadata={"help": "Expected batch of the LP-FT head phase per device, as "
                                                         "--per_device_train_batch_size (× the processes in all)."})
    head_phase_learning_rate: float = field(default=float(recipe_value(HEAD_ONLY_RECIPE, "--learning_rate")),
                                            metadata={"help": "Learning rate of the LP-FT head phase."})


@dataclass
class ScriptArguments(TrainArguments, LoraArguments, DataArguments, TaskArguments):
    """Every flag of the training script besides DPSAMConfig's: task or own data and base, LoRA, and the outputs."""

    refused_flags: ClassVar[dict[str, str]] = TRAIN_GLUE_REFUSED_FLAGS  # what parse_arguments refuses (name → why)


def shared_base(script: ScriptArguments) -> Path:
    """Save the sequence-classification base once; later runs reuse it (and refuse a different source)."""
    source = script.model_source()
    script = script.with_pooling()
    base_dir = Path(script.runs_dir) / BASE_DIR
    marker = base_dir / "hf_dpmerge_base.json"
    if marker.exists():
        saved = json.loads(marker.read_text())
        wanted = {"source": source, "classifier_pooling": script.classifier_pooling}
        found = {key: saved.get(key, "cls") for key in wanted}
        if found != wanted:
            raise ValueError(f"{base_dir} was built as {found}, not {wanted}: use another --runs_dir")
        return base_dir
    if base_dir.exists() and any(base_dir.iterdir()):
        raise FileExistsError(
            f"{base_dir} exists but was not built by this script (no {marker.name}): use another --runs_dir"
        )
    torch.manual_seed(script.base_seed)
    with transformers_errors_only():  # its placeholder head is new: the "missing" load report is expected
        model = load_sequence_classifier(source, num_labels=2, classifier_pooling=script.classifier_pooling)
    with staged_directory(base_dir) as staged:  # a killed run leaves no half-written base
        model.save_pretrained(staged)
        AutoTokenizer.from_pretrained(source).save_pretrained(staged)
        (staged / marker.name).write_text(json.dumps(
            {"source": source, "seed": script.base_seed, "classifier_pooling": script.classifier_pooling}
        ))
    return base_dir


def head_phase_epsilon(script: ScriptArguments, config: DPSAMConfig) -> float | None:
    """ε₁ of private LP-FT's head phase: ``--head_phase_epsilon``, else ``--head_phase_share`` × ``--target_epsilon``
    under DP for LoRA adapters; None without a head phase."""
    if not 0 <= script.head_phase_share < 1:
        raise ValueError(f"--head_phase_share must be in [0, 1) (0: no head phase), got {script.head_phase_share}")
    if script.head_phase_epsilon is not None:
        if not (script.train_lora and config.dp):
            raise ValueError("--head_phase_epsilon trains a head, then LoRA, under DP: it needs --train_lora true "
                             "and DP")
        return script.head_phase_epsilon
    if script.head_phase_share == 0 or not (script.train_lora and config.dp):
        return None
    if config.target_epsilon is None or config.noise_multiplier is not None:
        raise ValueError(f"--head_phase_share {script.head_phase_share:g} is a share of --target_epsilon, which "
                         f"{'is not set' if config.target_epsilon is None else '--noise_multiplier overrides'}: "
                         "pass --head_phase_epsilon (ε₁ of the head phase), or --head_phase_share 0 (none)")
    return script.head_phase_share * config.target_epsilon


def trains_head_phase(script: ScriptArguments, config: DPSAMConfig) -> bool:
    """Whether a run is LP-FT, a head phase before LoRA: for LoRA adapters, under DP when it has an ε₁
    (:func:`head_phase_epsilon`), without DP when ``--head_phase_share`` > 0 (the recipe's non-private twin: the
    same phases, unnoised)."""
    if not script.train_lora:
        return False
    return head_phase_epsilon(script, config) is not None if config.dp else script.head_phase_share > 0


def checkpoint_head_phase(script: ScriptArguments, config: DPSAMConfig, resume: str | bool) -> list[dict]:
    """The earlier phases that the LP-FT checkpoint ``resume`` (True: the last complete one) recorded: its
    ``dp_privacy.json``'s ``extra["phases"]`` but the last, its own. Refused when they are not a head phase of
    ``--head_phase_steps`` steps at ``--head_phase_batch_size`` per device."""
    checkpoint = last_complete_checkpoint(config.output_dir) if resume is True else Path(resume)
    earlier = PrivacyRecord.load(checkpoint).extra.get("phases", [])[:-1]
    wanted = [("head", script.head_phase_steps, script.head_phase_batch_size * config.world_size)]
    if [(p["name"], p["steps"], p["expected_batch_size"]) for p in earlier] != wanted:
        raise ValueError(f"checkpoint {checkpoint} was not trained after a head phase of --head_phase_steps "
                         f"{script.head_phase_steps} at --head_phase_batch_size {script.head_phase_batch_size} (its "
                         f"dp_privacy.json's extra.phases: {earlier}): resume with the flags it was trained with")
    return earlier


def head_phase(script: ScriptArguments, config: DPSAMConfig, base_dir: Path, spec, model, train, collator,
               out: Path, resume: str | bool | None = None) -> list[dict]:
    """LP-FT's first phase (:func:`trains_head_phase`): the head alone on cached pooled features at ε₁ (unnoised
    without DP), copied into ``model``'s head; returns the phase for the accountant of the second ([] without DP or
    LP-FT). When resuming the second phase, the checkpoint holds the head phase's model and record: it is not
    trained again (:func:`checkpoint_head_phase`)."""
    if not trains_head_phase(script, config):
        return []
    if resume:  # without DP the checkpoint holds the head phase's head, and there is no phase to account
        return checkpoint_head_phase(script, config, resume) if config.dp else []
    epsilon = head_phase_epsilon(script, config)  # None without DP
    head_model = lora_sequence_classifier(base_dir.resolve(), spec, train_lora=False, **script.lora_options())
    head_config = dataclasses.replace(
        config, output_dir=str(out / "checkpoints-head"), target_epsilon=epsilon,
        noise_multiplier=None, epsilon_budget=None, max_steps=script.head_phase_steps,
        per_device_train_batch_size=script.head_phase_batch_size, physical_batch_size=script.head_phase_batch_size,
        learning_rate=script.head_phase_learning_rate, head_learning_rate=script.head_phase_learning_rate,
        sam_mode="none", align_lambda=0.0, head_warmup_steps=0, average_last_steps=0, eval_strategy="no",
        eval_on_start=False,
    )
    trainer = dp_trainer(head_model, head_config, train_dataset=train, data_collator=collator,
                         **script.trainer_options())
    trainer.train()
    task_head(model).load_state_dict(task_head(head_model).state_dict())
    return [trainer.privacy_phase("head")] if config.dp else []


def task_sources(script: DataArguments, given: set[str]) -> dict[str, DatasetSource | None]:
    """The runs to train (``script``: either training script's arguments): ``{run name: own dataset}`` for
    ``--train_file``/``--dataset_name``, else ``{task: None}`` for each registry task of ``--task``/``--tasks``."""
    source = script.dataset_source()
    if source is None:
        return dict.fromkeys(parse_task_list(script.tasks or script.task, "--tasks" if script.tasks else "--task",
                                             known=True))
    if clash := sorted(given & {"task", "tasks", "dataset_path"}):
        raise ValueError(f"--{clash[0]} names a packaged or GLUE task, --train_file/--dataset_name your own data: "
                         "give one of them")
    return {script.own_task_name(): source}


def load_training_data(task: str, source: DatasetSource | None, config: DPSAMConfig, *,
                       max_train_samples: int | None = None, max_eval_samples: int | None = None,
                       path: str | None = None) -> TaskData:
    """Task ``task``'s splits (``load_task``'s subsets and GLUE ``path``), checked (columns, labels, privacy unit)
    before anything is written."""
    unit = config.privacy_unit_column
    with config.main_process_first(local=not config.save_on_each_node, desc=f"{task} data"):
        data = load_task(task, max_train_samples=max_train_samples, max_eval_samples=max_eval_samples, path=path,
                         source=source, keep_columns=(unit,) if unit and source else ())
    if unit is not None and unit not in data.splits["train"].column_names:
        raise ValueError(
            f"--privacy_unit_column {unit}: task {task} has no such column (its columns: "
            f"{data.splits['train'].column_names}); rotten_tomatoes has 'movie', the other packaged tasks none"
        )
    return data


def record_own_dataset(spec: TaskSpec, run_dir: Path, record: PrivacyRecord) -> None:
    """For an own dataset's run: write ``<run_dir>/dataset.json``, where evaluate and tune read the same rows (beside
    the release, never in it), and state in ``record`` where its label names came from and which splits were
    carved from its training rows (the cards say so)."""
    if spec.dataset is None:
        return
    spec.dataset.save(run_dir)
    record.extra.update(label_names_from=spec.label_origin, carved_splits=list(spec.carved_splits),
                        label_names_private=spec.label_origin == LABELS_FROM_PRIVATE_DATA)


def train_task(task: str, task_data: TaskData, script: ScriptArguments, config: DPSAMConfig, base_dir: Path,
               resume: str | bool | None = None) -> dict | None:
    """Train one task on its loaded ``task_data`` (``resume``: a checkpoint, or True for the last complete one); returns
    its summary on the process that writes the outputs, None on the others. ``--eval_strategy`` evaluates on the
    validation split, private data like the training split: those logs are not covered by the DP guarantee."""
    splits, spec = task_data
    unit = config.privacy_unit_column
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    with config.main_process_first(local=not config.save_on_each_node, desc=f"{task} tokens"):
        data = tokenize_task(splits, spec, tokenizer, max_length=script.max_length,
                             keep_columns=(unit,) if unit is not None else ())
    # an absolute base path for training; the release names the base by Hub id or by its relative base/ only
    model = lora_sequence_classifier(base_dir.resolve(), spec, train_lora=script.train_lora, **script.lora_options())
    out = Path(script.runs_dir) / task
    args = dataclasses.replace(config, output_dir=str(out / "checkpoints"))
    evaluating = str(config.eval_strategy) not in ("no", "IntervalStrategy.NO") or config.eval_on_start
    if evaluating and "validation" not in data:
        raise ValueError(f"--eval_strategy/--eval_on_start: task {task} has no validation split")
    collator = DataCollatorWithPadding(tokenizer)
    earlier = head_phase(script, args, base_dir, spec, model, data["train"], collator, out, resume)
    # the frozen bottom (below the lowest LoRA layer; the whole encoder with --train_lora false) runs once per row
    trainer = dp_trainer(model, args, train_dataset=data["train"], data_collator=collator,
                         eval_dataset=data["validation"] if evaluating else None,
                         compute_metrics=trainer_compute_metrics(spec) if evaluating else None,
                         earlier_phases=earlier, **script.trainer_options())
    trainer.train(resume_from_checkpoint=resume)
    adapter_dir = out / ADAPTER_DIR  # saved before predicting: --fp16/bf16_full_eval cast the model for prediction
    trainer.save_model(str(adapter_dir), overwrite=script.overwrite)
    prediction = trainer.predict(data["test"])
    metrics = compute_metrics(spec, predictions_from_logits(spec, prediction.predictions), prediction.label_ids)
    if not config.should_save:
        return None
    record = PrivacyRecord.load(adapter_dir)
    record.task = task
    record_own_dataset(spec, out, record)
    record.extra.update(label_names=list(spec.label_names), max_length=script.max_length,
                        classifier_pooling=script.classifier_pooling, train_lora=script.train_lora,
                        base_model_hub_id=source_hub_id(script.model_source()),  # for the card's base_model
                        dataset_hub_id=glue_dataset_hub_id(spec, script.dataset_path))  # and its datasets
    record.save(adapter_dir)
    export_encoder_adapter(adapter_dir, out / ENCODER_ADAPTER_DIR)
    shared_encoder = Path(os.path.relpath(base_dir / SHARED_ENCODER_FILE, adapter_dir / ADAPTER_BASE_DIR)).as_posix()
    make_adapter_stock_loadable(adapter_dir, base_dir, spec.label_names, shared_encoder)  # the encoder stays once
    write_adapter_card(adapter_dir, record)  # now with the task, the base's Hub id and the stock base's usage
    summary = {"task": task, "test": metrics, "epsilon": record.epsilon, "delta": record.delta,
               "epsilon_replace_one": record.epsilon_replace_one, "privacy_unit": record.privacy_unit,
               "steps": record.steps, "num_samples": record.num_samples, "num_units": record.num_units}
    (out / EVAL_METRICS_NAME).write_text(json.dumps(summary, indent=2) + "\n")
    replace_one = "–" if record.epsilon_replace_one is None else f"{record.epsilon_replace_one:.3g}"
    print(f"[{task}] test {spec.metric} = {metrics[spec.metric]:.4f}, ε = {record.epsilon:.3g} (add/remove-one; "
          f"replace-one {replace_one}), δ = {record.delta:.3g}, per {record.privacy_unit} ({record.num_units} units)")
    return summary


def argument_parser(arguments: type = ScriptArguments, defaults: list[str] = DP_DEFAULTS) -> ScriptParser:
    """The script's command-line parser: ``arguments`` (:class:`ScriptArguments`) and :class:`DPSAMConfig`, its
    defaults the values the script runs with (the recipe of ``defaults``, not TrainingArguments'), so ``--help``
    shows them, and the flags ``arguments.refused_flags`` refuses left out of ``--help``."""
    import argparse

    parser = ScriptParser((arguments, DPSAMConfig))
    recipe = parser.parse_known_args(defaults)[0]
    given = {action.dest for action in parser._actions if set(action.option_strings) & set(defaults)}
    parser.set_defaults(**{name: getattr(recipe, name) for name in given})
    for action in parser._actions:
        if action.dest in arguments.refused_flags:
            action.help = argparse.SUPPRESS
    return parser


class ScriptParser(HfArgumentParser):
    """The scripts' parser: ``--label_names`` is the own data's label set (:class:`DataArguments`), not
    TrainingArguments' names of the label inputs (the scripts' labels are always ``labels``). The one flag keeps
    DataArguments' type and help; every other dataclass's ``label_names`` stays None."""

    def __init__(self, dataclass_types: tuple[type, ...]) -> None:
        super().__init__(dataclass_types, conflict_handler="resolve", allow_abbrev=False)
        if any(issubclass(kind, DataArguments) for kind in dataclass_types):
            item = next(f for f in dataclasses.fields(DataArguments) if f.name == "label_names")
            action = next(action for action in self._actions if action.dest == "label_names")
            action.type, action.nargs, action.help = str, None, item.metadata["help"]
        group_flags(self, dataclass_types[0])

    def error(self, message: str) -> NoReturn:
        """One line and a pointer to ``--help`` (argparse would print the whole usage first)."""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def parse_args_into_dataclasses(self, args=None, **_: object) -> tuple:
        parsed, remaining = self.parse_known_args(args)
        if remaining:  # as HfArgumentParser says it: one line through run_script, not argparse's usage
            raise ValueError(f"Some specified arguments are not used by the HfArgumentParser: {remaining}")
        namespace = vars(parsed)
        own = [kind for kind in self.dataclass_types if issubclass(kind, DataArguments)]

        def value(kind: type, name: str):
            return None if own and name == "label_names" and kind not in own else namespace[name]

        return tuple(kind(**{f.name: value(kind, f.name) for f in dataclasses.fields(kind) if f.init})
                     for kind in self.dataclass_types)


def parse_arguments(argv: list[str], arguments: type = ScriptArguments, defaults: list[str] = DP_DEFAULTS,
                    script_name: str = "train_glue.py") -> tuple[ScriptArguments, DPSAMConfig]:
    """The script's flags after the defaults (``defaults`` first — for train_glue.py ``HEAD_ONLY_DEFAULTS`` with
    ``--train_lora false`` — so every later flag overrides them), those of ``arguments.refused_flags`` refused."""
    parser = argument_parser(arguments, defaults)
    refuse_ignored_flags(parser, argv, defaults, script_name, arguments.refused_flags)
    script, config = parser.parse_args_into_dataclasses(args=[*recipe_defaults(parser, argv, defaults), *argv])
    refuse_non_private_step_flags(config, script_name)
    return script, config


class PlannedRun(NamedTuple):
    """One task's checked data and the flags it trains with (the batches fitted to its size)."""

    data: TaskData
    script: ScriptArguments
    config: DPSAMConfig


def plan_runs(argv: list[str], defaults: list[str] = DP_DEFAULTS) -> dict[str, PlannedRun]:
    """Parse ``argv`` (after ``defaults``), then load, check and fit every task's data and check every release
    target: nothing is written (what :func:`main` and the benchmarks train from)."""
    script, config = parse_arguments(argv, defaults=defaults)
    script = script.with_pooling()
    given = given_flags(argument_parser(defaults=defaults), argv)
    if "max_steps" in given and "head_phase_steps" not in given:  # a quick run is quick in both phases
        script = dataclasses.replace(script, head_phase_steps=min(script.head_phase_steps, config.max_steps))
    sources = task_sources(script, given)
    resume_point(config, list(sources))
    for task in sources:  # refuse to replace a release before training anything, not after
        check_release_target(Path(script.runs_dir) / task / ADAPTER_DIR, script.overwrite)
    data = {task: load_training_data(task, source, config, max_train_samples=script.max_train_samples,
                                     max_eval_samples=script.max_eval_samples, path=script.dataset_path)
            for task, source in sources.items()}
    lp_ft = trains_head_phase(script, config)
    return {task: PlannedRun(data[task], *fit_to_data(task, script, config, data[task].splits["train"], given, lp_ft,
                                                      encoder=script.train_lora))
            for task in sources}


def main(argv: list[str] | None = None) -> dict[str, dict]:
    """Train every task of ``argv`` (default: the command line) from one shared base: every dataset is loaded and
    checked, and every release target checked, before the base or anything else is written (:func:`plan_runs`).
    Returns each task's summary (``eval_metrics.json``) on the process that writes the outputs."""
    runs = plan_runs(list(sys.argv[1:] if argv is None else argv))
    script, config = next(iter(runs.values()))[1:]
    resume = resume_point(config, list(runs))
    with config.main_process_first(local=not config.save_on_each_node, desc="shared base"):
        base_dir = shared_base(script)
    summaries = {task: train_task(task, *run, base_dir, resume) for task, run in runs.items()}
    # multi-process: leave together and release the process group (a process leaving early can abort in gloo)
    config.distributed_state.wait_for_everyone()
    config.distributed_state.destroy_process_group()
    return {task: summary for task, summary in summaries.items() if summary is not None}


if __name__ == "__main__":
    from hf_dpmerge.utils.user_errors import run_script

    run_script(main)
