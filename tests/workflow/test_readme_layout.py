"""The "Layout" block of docs/architecture.md (once the README's) matches the tree: every path it names exists,
and every module and subpackage of ``hf_dpmerge`` is named in its package's entry (or has an entry of its own).

The block has one entry per line that starts in column 0: a path (a folder ``…/`` or a file), then a description
whose continuation lines are indented. A name in a description (``x.py``, ``x.md``, ``x.sh``, ``x/``) is relative
to the entry's folder; a name holding a ``/`` (``examples/train_glue.py``) is relative to the repository root.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hf_dpmerge"
NAME = re.compile(r"(?<![\w./<>-])((?:[A-Za-z_][\w-]*/)*[A-Za-z_][\w-]*(?:\.py|\.md|\.sh|/))(?![\w>])")


def layout_entries() -> dict[str, str]:
    """``{entry path: description}`` of the Layout block of docs/architecture.md."""
    document = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"^## Layout\n.*?^```\n(.*?)^```", document, re.S | re.M)
    assert block, "docs/architecture.md has no ```-fenced block under '## Layout'"
    entries: dict[str, str] = {}
    path = None
    for line in block.group(1).splitlines():
        if line[:1].strip():
            path, _, description = line.partition(" ")
            assert path not in entries, f"the layout names {path} twice"
            entries[path] = description
        elif line.strip():
            assert path is not None, f"the layout starts with an indented line: {line!r}"
            entries[path] += " " + line.strip()
    return entries


def named_paths(entry: str, description: str) -> set[Path]:
    folder = ROOT / entry if entry.endswith("/") else (ROOT / entry).parent
    return {(ROOT if "/" in name.rstrip("/") else folder) / name for name in NAME.findall(description)}


def test_every_path_the_layout_names_exists():
    missing = [
        str(path.relative_to(ROOT))
        for entry, description in layout_entries().items()
        for path in {ROOT / entry} | named_paths(entry, description)
        if not path.exists()
    ]
    assert not missing, f"docs/architecture.md's layout names paths that do not exist: {missing}"


def test_every_module_and_subpackage_of_the_package_is_in_the_layout():
    entries = layout_entries()
    named = {ROOT / entry for entry in entries}
    for entry, description in entries.items():
        named |= named_paths(entry, description)
    packages = [p.parent for p in PACKAGE.rglob("__init__.py") if "__pycache__" not in p.parts]
    unlisted = sorted(
        str(child.relative_to(ROOT))
        for package in packages
        for child in package.iterdir()
        if child.name not in ("__init__.py", "__pycache__") and (child.suffix == ".py" or child.is_dir())
        and child not in named
    )
    assert not unlisted, f"docs/architecture.md's layout does not list: {unlisted}"


def test_the_check_reads_names_and_folders_as_documented():
    assert named_paths("hf_dpmerge/records/", "card.py (+ card_templates/), statement.py, dp_state.pt") == {
        PACKAGE / "records" / "card.py", PACKAGE / "records" / "card_templates",
        PACKAGE / "records" / "statement.py"}
    assert named_paths("hf_dpmerge/lora.py", "what examples/train_glue.py runs; <out>/<task>/") == {
        ROOT / "examples" / "train_glue.py"}
