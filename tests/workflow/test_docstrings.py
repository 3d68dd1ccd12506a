"""Code states the spec, docs hold the evidence: no module docstring of the repository's Python runs over 15 lines.

A module docstring says what the module computes, its formula, the paper it implements and where the rest is
(``docs/design.md §N``, ``docs/<file>.md``, ``benchmarks/reports/<study>/<REPORT>.md``); measurements, dates and
search histories belong in those documents, and the explanation of a tricky line in a comment at that line.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
FOLDERS = ("hf_dpmerge", "benchmarks", "examples", "tests", "mergekit_hook")
MAX_LINES = 15


def docstring_lines() -> dict[str, int]:
    """``{module path relative to the repository: number of lines of its module docstring}`` (0 without one)."""
    lengths = {}
    for path in sorted(path for folder in FOLDERS for path in (REPOSITORY / folder).rglob("*.py")):
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        lengths[path.relative_to(REPOSITORY).as_posix()] = len(docstring.splitlines()) if docstring else 0
    return lengths


def test_no_module_docstring_runs_over_fifteen_lines() -> None:
    too_long = {name: count for name, count in docstring_lines().items() if count > MAX_LINES}
    assert not too_long, (f"module docstrings over {MAX_LINES} lines (say what the module computes and point to "
                          f"docs/design.md §N or a benchmark report for the rest): {too_long}")
