"""Train private LoRA adapters: ``examples/train_glue.py`` as a verb (every flag of the training script).

    hf-dpmerge train --tasks rotten_tomatoes,election_tweets --target_epsilon 8
    hf-dpmerge train --help          # the training script's flags, with the defaults it runs with

One process; for several (``--use_cpu`` gloo or GPUs) run ``accelerate launch examples/train_glue.py``, the
same code (:mod:`hf_dpmerge.scripts.train`).
"""

from __future__ import annotations

import argparse

from hf_dpmerge.cli.dataclass_help import add_dataclass_help

ADD_HELP = False  # -h/--help prints the training script's help


def _script_parser() -> argparse.ArgumentParser:
    from hf_dpmerge.scripts.train import argument_parser  # torch and transformers: only when asked for

    return argument_parser()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    add_dataclass_help(parser, _script_parser, __doc__)
    parser.set_defaults(accepts_extra=True)


def run(args: argparse.Namespace) -> int:
    from hf_dpmerge.scripts.train import main

    main(args.extra)
    return 0
