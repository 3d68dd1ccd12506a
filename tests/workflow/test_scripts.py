"""The training script's flags live in hf_dpmerge.scripts (examples/train_glue.py is a thin launcher over them),
and ``hf-dpmerge audit`` takes the same task and LoRA flags from the same dataclasses."""

import dataclasses
import re

import pytest

from hf_dpmerge.cli.main import main
from hf_dpmerge.scripts.arguments import DataArguments, LoraArguments, TaskArguments
from hf_dpmerge.scripts.train import ScriptArguments, TrainArguments, head_phase_epsilon, parse_arguments
from hf_dpmerge.training.recipe import DP_RECIPE, HEAD_ONLY_RECIPE, LORA_RECIPE, LPFT_RECIPE, recipe_value

TRAIN_FLAGS = {
    "task": "bbc_news", "tasks": "bbc_news,rotten_tomatoes", "model_name_or_path": "some/model", "runs_dir": "out",
    "dataset_path": "glue-copy", "max_length": 32, "max_train_samples": 100, "max_eval_samples": 50, "lora_r": 4,
    "lora_alpha": 8, "lora_target_modules": "query", "lora_layers": "all", "base_seed": 3, "classifier_pooling": "cls",
    "overwrite": True, "train_lora": False, "lora_freeze_a": True, "lora_a_seed": 5, "cache_prefix": "false",
    "cache_dtype": "float32", "prefix_cache_dir": "prefixes", "head_phase_epsilon": 2.0, "head_phase_share": 0.5,
    "lora_recipe": "one_phase",
    "head_phase_steps": 7,
    "head_phase_batch_size": 9, "head_phase_learning_rate": 0.5,
    "dataset_name": "me/data", "dataset_config_name": "plain", "train_file": "t.csv", "validation_file": "v.csv",
    "test_file": "e.csv", "text_column": "body", "text_pair_column": "reply", "label_column": "y",
    "label_names": "no,yes", "label_names_from_private_data": True, "task_name": "mine",
}


def test_every_training_flag_parses_into_the_script_arguments() -> None:
    argv = [part for name, value in TRAIN_FLAGS.items() for part in (f"--{name}", str(value))]
    script, config = parse_arguments(argv)
    assert {name: getattr(script, name) for name in TRAIN_FLAGS} == TRAIN_FLAGS
    # the recipe comes first: the head-only one with --train_lora false, else the LoRA one
    assert config.max_steps == int(HEAD_ONLY_RECIPE[HEAD_ONLY_RECIPE.index("--max_steps") + 1])
    assert parse_arguments([])[1].max_steps == int(recipe_value(LPFT_RECIPE, "--max_steps"))
    assert parse_arguments(["--max_steps", "7"])[1].max_steps == 7  # and any flag overrides it


def test_lora_adapters_default_to_private_lp_ft_and_the_head_only_floor_does_not_take_it() -> None:
    """LPFT_RECIPE (phase 1 the private head at 0.75 ε, phase 2 FFA-LoRA on the top two layers, plain DP-SGD) is
    the LoRA default; --train_lora false runs HEAD_ONLY_RECIPE without a head phase; any flag overrides both."""
    script, config = parse_arguments([])
    assert script.lora_freeze_a is True and script.lora_layers == "top_2"
    assert (config.max_steps, config.per_device_train_batch_size, config.sam_mode, config.align_lambda) == (
        75, 1024, "none", 0.0)
    assert head_phase_epsilon(script, config) == 0.75 * config.target_epsilon == 6.0
    assert head_phase_epsilon(*parse_arguments(["--target_epsilon", "4"])) == 3.0
    assert head_phase_epsilon(*parse_arguments(["--head_phase_epsilon", "5"])) == 5.0  # an explicit ε₁ wins
    assert head_phase_epsilon(*parse_arguments(["--head_phase_share", "0"])) is None
    assert head_phase_epsilon(*parse_arguments(["--no_dp"])) is None  # no ε to share: one non-private phase
    script, config = parse_arguments(["--train_lora", "false"])
    assert script.lora_freeze_a is False and config.head_warmup_steps == 0
    assert config.max_steps == int(recipe_value(HEAD_ONLY_RECIPE, "--max_steps"))
    assert head_phase_epsilon(script, config) is None  # the floor is the head itself
    script, config = parse_arguments(["--lora_freeze_a", "false", "--head_warmup_steps", "3"])
    assert script.lora_freeze_a is False and config.head_warmup_step_count(config.max_steps) == 3


def test_the_one_phase_recipe_is_the_lora_default_before_lp_ft() -> None:
    """--lora_recipe one_phase parses exactly as the script parsed no flag before LP-FT became the default (DP_RECIPE
    then LORA_RECIPE, every other flag at its dataclass default); the head-only floor ignores it."""
    before = [*DP_RECIPE, "--per_device_eval_batch_size", "128", *LORA_RECIPE]
    old_script, old_config = parse_arguments([], defaults=before)
    script, config = parse_arguments(["--lora_recipe", "one_phase"])
    assert dataclasses.replace(script, lora_recipe="lp_ft") == old_script
    assert {k: v for k, v in config.to_dict().items() if k != "logging_dir"} == {
        k: v for k, v in old_config.to_dict().items() if k != "logging_dir"}
    assert head_phase_epsilon(script, config) is None and script.lora_layers == "top_half"
    assert parse_arguments(["--lora_recipe", "one_phase", "--max_steps", "7"])[1].max_steps == 7
    head_only = parse_arguments(["--lora_recipe", "one_phase", "--train_lora", "false"])[1]
    assert head_only.max_steps == int(recipe_value(HEAD_ONLY_RECIPE, "--max_steps"))


@pytest.mark.parametrize("argv, message", [
    (["--head_phase_share", "1"], "--head_phase_share must be in \\[0, 1\\)"),
    (["--head_phase_share", "-0.1"], "--head_phase_share must be in"),
    (["--target_epsilon", "8", "--head_phase_epsilon", "2", "--no_dp"], "it needs --train_lora true and DP"),
    (["--noise_multiplier", "1.5"], "--noise_multiplier overrides: pass --head_phase_epsilon"),
])
def test_a_bad_head_phase_is_refused_naming_the_flag(argv, message) -> None:
    with pytest.raises(ValueError, match=message):
        head_phase_epsilon(*parse_arguments(argv))


def test_help_shows_the_values_the_script_runs_with_and_hides_refused_flags() -> None:
    from hf_dpmerge.scripts.train import TRAIN_GLUE_REFUSED_FLAGS, argument_parser

    help_text = " ".join(argument_parser().format_help().split("\n\n", 1)[1].split())  # after the usage
    for flag in ("per_device_train_batch_size", "learning_rate", "max_steps", "save_strategy"):
        value = recipe_value([*DP_RECIPE, *LPFT_RECIPE], f"--{flag}")  # LPFT_RECIPE's last word
        shown = re.search(rf"--{flag} .*?\(default: ([^)]*)\)", help_text).group(1)
        assert shown == value or float(shown) == float(value), (flag, shown, value)
    assert not [name for name in TRAIN_GLUE_REFUSED_FLAGS if f"--{name} " in help_text]



def test_each_script_hides_and_refuses_its_own_arguments_table() -> None:
    from hf_dpmerge.scripts.train import REFUSED_FLAGS, TRAIN_GLUE_REFUSED_FLAGS, argument_parser
    from hf_dpmerge.scripts.train_causal_lm import CAUSAL_DP_DEFAULTS, SCRIPT, CausalScriptArguments

    assert ScriptArguments.refused_flags is TRAIN_GLUE_REFUSED_FLAGS
    assert CausalScriptArguments.refused_flags is REFUSED_FLAGS
    causal_help = " ".join(argument_parser(CausalScriptArguments, CAUSAL_DP_DEFAULTS).format_help().split())
    assert all(f"--{flag} " in causal_help for flag in ("anchor_lambda", "verbalizers", "prompt_column"))
    assert not [name for name in REFUSED_FLAGS if f"--{name} " in causal_help]
    config = parse_arguments(["--anchor_lambda", "0.5"], CausalScriptArguments, CAUSAL_DP_DEFAULTS, SCRIPT)[1]
    assert config.anchor_lambda == 0.5
    with pytest.raises(ValueError, match=f"--output_dir is not used by {SCRIPT}"):
        parse_arguments(["--output_dir", "x"], CausalScriptArguments, CAUSAL_DP_DEFAULTS, SCRIPT)
    with pytest.raises(ValueError, match="--anchor_lambda is not used by train_glue.py"):
        parse_arguments(["--anchor_lambda", "0.5"])


def test_help_groups_the_script_flags_first_and_hides_what_the_dp_step_refuses(capsys) -> None:
    from hf_dpmerge.scripts.help_groups import HIDDEN
    from hf_dpmerge.scripts.train import argument_parser

    help_text = argument_parser().format_help()
    lines = help_text.splitlines()
    titles = [line for line in lines if line.endswith(":") and not line.startswith(" ")]
    assert titles[:5] == ["task and data:", "privacy:", "LoRA and LP-FT:", "training:", "outputs:"]
    assert next(i for i, line in enumerate(lines) if "--target_epsilon" in line) < 80
    assert not [name for name in HIDDEN if f"--{name} " in help_text]
    assert all(action.help for action in argument_parser()._actions)  # every flag says what it does
    with pytest.raises(ValueError, match="target_eps"):  # no abbreviation of --target_epsilon
        parse_arguments(["--target_eps", "4"])
    with pytest.raises(ValueError, match="fp16"):  # hidden, still refused
        parse_arguments(["--fp16", "true"])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        argument_parser().parse_args(["--max_steps", "abc"])
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "invalid int value: 'abc' (see --help)" in error  # no usage dump


def test_the_script_arguments_are_the_shared_task_and_lora_arguments() -> None:
    names = {f.name for f in dataclasses.fields(ScriptArguments)}
    shared = {f.name for kind in (TaskArguments, LoraArguments, TrainArguments, DataArguments)
              for f in dataclasses.fields(kind)}
    assert names == shared == set(TRAIN_FLAGS)


def test_a_bad_pooling_is_refused_by_the_parser() -> None:
    with pytest.raises(SystemExit):
        parse_arguments(["--classifier_pooling", "max"])


def test_audit_takes_the_task_and_lora_flags_of_training(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["audit", "--help"])
    help_text = capsys.readouterr().out
    assert all(f"--{f.name}" in help_text for kind in (TaskArguments, LoraArguments) for f in dataclasses.fields(kind))
    assert main(["audit", "--lora_r", "0"]) == 2
    assert "--lora_r must be positive, got 0" in capsys.readouterr().err


def test_version_names_the_installed_package(capsys) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.strip() == f"hf-dpmerge {version('hf_dpmerge')}"


def test_every_option_of_every_verb_has_help() -> None:
    import argparse

    from hf_dpmerge.cli.main import build_parser
    from hf_dpmerge.scripts.train import argument_parser

    argument_parser()  # HfArgumentParser resolves the shared dataclasses' field types in place first
    verbs = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    bare = [f"{verb} {action.option_strings[0]}" for verb, parser in verbs.items() for action in parser._actions
            if action.option_strings and action.dest != "help" and not (action.help or "").strip()]
    assert not bare, f"options without help text: {bare}"


def test_the_train_verb_runs_the_training_script_with_every_flag(monkeypatch) -> None:
    import hf_dpmerge.scripts.train as train_script

    seen = []
    monkeypatch.setattr(train_script, "main", seen.append)
    argv = ["--task", "bbc_news", "--max_steps", "3", "--lora_freeze_a", "false", "--no_dp"]
    assert main(["train", *argv]) == 0 and seen == [argv]


def test_the_train_verb_shows_the_scripts_help_and_reports_bad_input(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert exit_info.value.code == 0 and help_text.startswith("usage: hf-dpmerge train")
    assert re.search(r"--lora_freeze_a .*?\(default: True\)", help_text)  # the defaults it runs with
    assert main(["train", "--task", "nope"]) == 2 and "unknown task 'nope'" in capsys.readouterr().err
