"""Train private LoRA adapters: ``examples/train_glue.py`` as a verb (every flag of the training script).

    hf-dpmerge train --tasks rotten_tomatoes,election_tweets --target_epsilon 8
    hf-dpmerge train --help          # the training script's flags, with the defaults it runs with

One process; for several (``--use_cpu`` gloo or GPUs) run ``accelerate launch examples/train_glue.py``, the
same code (:mod:`hf_dpmerge.scripts.train`).
"""

from __future__ import annotations

import argparse
from typing import Any

ADD_HELP = False  # -h/--help prints the training script's help (:class:`_ScriptHelp`)


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """This module's docstring as written; each flag with the default the script runs with."""


class _ScriptHelp(argparse.Action):
    """``-h``/``--help``: the training script's own help (its flags and defaults), not this verb's stub."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option_string: str = "") -> None:
        from hf_dpmerge.scripts.train import argument_parser

        script = argument_parser()
        script.prog = "hf-dpmerge train"
        script.description = __doc__
        script.formatter_class = _Formatter
        script.print_help()
        parser.exit()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.add_argument("-h", "--help", action=_ScriptHelp, nargs=0, help="the training script's flags")
    parser.set_defaults(accepts_extra=True)


def run(args: argparse.Namespace) -> int:
    from hf_dpmerge.scripts.train import main

    main(args.extra)
    return 0
