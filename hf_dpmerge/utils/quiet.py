"""Quiet calls: the warnings and log lines our own calls make where their cause is expected and harmless."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

EXPECTED_WARNINGS = (
    # peft's PeftModel reads transformers' deprecated ``is_gradient_checkpointing`` when it wraps a model
    (FutureWarning, r"`is_gradient_checkpointing` is deprecated"),
    # per-sample gradient hooks on the layers above a cached prefix, whose inputs need no gradient
    (UserWarning, r"Full backward hook is firing when gradients are computed with respect to module outputs"),
)


@contextmanager
def expected_warnings_ignored() -> Iterator[None]:
    """Ignore :data:`EXPECTED_WARNINGS` inside the block (every other warning passes)."""
    with warnings.catch_warnings():
        for category, message in EXPECTED_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category)
        yield


@contextmanager
def _errors_only(logging) -> Iterator[None]:
    """``logging`` (transformers' or huggingface_hub's ``utils.logging``) at error level inside the block."""
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)


@contextmanager
def transformers_errors_only() -> Iterator[None]:
    """transformers' logging at error level and its progress bars off inside the block (restored after): its
    load report of a head we re-create or replace right after is noise."""
    from transformers.utils import logging

    bars = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        with _errors_only(logging):
            yield
    finally:
        if bars:
            logging.enable_progress_bar()


@contextmanager
def hub_errors_only() -> Iterator[None]:
    """huggingface_hub's logging at error level inside the block (restored after): a card section we render has no
    metadata block by design, which it would report."""
    from huggingface_hub.utils import logging

    with _errors_only(logging):
        yield
