"""README.md stays a short reference: at most 200 lines and no ISO date (measurements with their dates live in
docs/benchmarks.md)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
MAX_LINES = 200
ISO_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")


def test_the_readme_has_at_most_200_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines (at most {MAX_LINES})"


def test_the_readme_holds_no_iso_date() -> None:
    text = README.read_text(encoding="utf-8")
    dates = [f"{text[:m.start()].count(chr(10)) + 1}: {m.group(0)}" for m in ISO_DATE.finditer(text)]
    assert dates == [], f"README.md holds dates (move dated results to docs/benchmarks.md): {dates}"


def test_the_date_check_finds_a_date() -> None:
    assert ISO_DATE.search("ran on 2026-12-06 from a fresh clone")
    assert not ISO_DATE.search("arXiv 2412.00081, ICML 2025, torch==2.13.0")
