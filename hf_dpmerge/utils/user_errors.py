"""User mistakes end as one ``<prog>: error: <message>`` line on stderr and exit status 2, as argparse ends its own.

A user error is an ``OSError`` (a missing or existing path, permissions, a full disk, an unreachable Hub) or a
``ValueError`` raised by hf_dpmerge's own code: its checks of flags, configs, folders and records
(``PrivacyRecordError``, ``PushError`` and ``UnknownTaskError`` are ValueErrors), whose messages name the problem
and what to change. Anything else — a ValueError from inside torch, transformers or mergekit, a KeyError, a
RuntimeError — is unexpected and keeps its traceback. The entry points apply this (``hf-dpmerge`` in
:mod:`hf_dpmerge.cli.main`, the scripts through :func:`run_script`); the Python API raises as documented.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

USAGE_ERROR = 2  # argparse's exit status for bad usage
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def is_user_error(err: BaseException) -> bool:
    """Whether ``err`` is a user error (module docstring): any OSError, or a ValueError raised in hf_dpmerge."""
    if isinstance(err, OSError):
        return True
    if not isinstance(err, ValueError) or err.__traceback__ is None:
        return False
    frame = err.__traceback__
    while frame.tb_next is not None:
        frame = frame.tb_next
    return Path(frame.tb_frame.f_code.co_filename).resolve().is_relative_to(PACKAGE_DIR)


def error_line(prog: str, err: BaseException | str) -> str:
    """``<prog>: error: <message>`` on one line (a message's own line breaks become spaces)."""
    return f"{prog}: error: {' '.join(str(err).split())}"


def run_script(main: Callable[[], Any], prog: str | None = None) -> None:
    """Run a script's ``main``; a user error ends it as :func:`error_line` (``prog``: the script's file name, as
    argparse names it) with exit status 2."""
    try:
        main()
    except (ValueError, OSError) as err:
        if not is_user_error(err):
            raise
        print(error_line(prog or Path(sys.argv[0]).name, err), file=sys.stderr)
        sys.exit(USAGE_ERROR)
