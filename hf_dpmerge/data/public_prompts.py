"""Public prompts of the public anchor (docs/design.md §14.1): the packaged set, or a user's file.

The packaged set (``hf_dpmerge/data/public/anchor_prompts.json``) was written for this project and holds no task's
data: short questions of many formats (a fact, yes or no, a word to pick among a few), the kind of prompt a
merged instruction model meets besides one task's.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

PACKAGED = "packaged"
PACKAGED_PROMPTS = Path(__file__).parent / "public" / "anchor_prompts.json"


def load_public_prompts(source: str = PACKAGED) -> list[str]:
    """The prompts of ``source``: ``"packaged"``; a ``.json`` file holding a list of strings (or ``{"prompts":
    [...]}``); any other file, one prompt per non-empty line. Refused: a missing file, no prompt, a prompt that is
    not a non-empty string."""
    path = PACKAGED_PROMPTS if source == PACKAGED else Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"--anchor_prompts {source}: no such file (pass '{PACKAGED}' or a file of prompts)")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"--anchor_prompts {source}: not valid JSON ({err})") from err
        prompts = loaded.get("prompts") if isinstance(loaded, dict) else loaded
        if not isinstance(prompts, list) or not all(isinstance(p, str) and p.strip() for p in prompts):
            raise ValueError(f"--anchor_prompts {source}: expected a list of non-empty strings (or an object whose "
                             "'prompts' is one)")
    else:
        prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"--anchor_prompts {source}: holds no prompt")
    return prompts


def prompts_digest(prompts: list[str]) -> str:
    """SHA-256 of the prompts (joined by newlines): what a record states instead of the file's path."""
    return hashlib.sha256("\n".join(prompts).encode()).hexdigest()
