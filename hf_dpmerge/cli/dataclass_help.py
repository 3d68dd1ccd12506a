"""``-h``/``--help`` of a verb whose flags are dataclass fields parsed by ``transformers.HfArgumentParser`` (the
verb's argparse stub collects them as extra arguments): the dataclass parser's help, under the verb's name."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description as written; each flag with the default the verb runs with."""


def add_dataclass_help(parser: argparse.ArgumentParser, build: Callable[[], argparse.ArgumentParser],
                       description: str) -> None:
    """Give ``parser`` (created with ``add_help=False``) a ``-h``/``--help`` that prints ``build()``'s help."""

    class Help(argparse.Action):
        def __call__(self, stub: argparse.ArgumentParser, namespace: Any, values: Any, option: str = "") -> None:
            full = build()
            full.prog, full.description, full.formatter_class = stub.prog, description, _Formatter
            full.print_help()
            stub.exit()

    parser.add_argument("-h", "--help", action=Help, nargs=0, help="show the flags and exit")
