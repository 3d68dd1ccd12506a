"""docs/*.md read as a reference, not a lab notebook: no heading is titled by a date or by the order of the work, the
two longest documents stay within their bounds, and the LP-FT default that docs/design.md §15.6 states is the one
hf_dpmerge.training.recipe defines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hf_dpmerge.training.recipe import LPFT_RECIPE, recipe_value

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted((REPO / "docs").glob("*.md"))
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
NOTEBOOK_HEADING = re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\bsession\b", re.I)
MAX_LINES = {"causal-lm.md": 341, "design.md": 580}  # half of each before the reference rewrite (682, 1161)
LPFT_FLAGS = ("--per_device_train_batch_size", "--max_steps", "--learning_rate")
SUPERSCRIPT = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻", "0123456789-")


def headings(text: str) -> list[str]:
    """The markdown headings of ``text``, outside fenced blocks (a ``# comment`` in a bash block is none)."""
    return [line for line in FENCE.sub("", text).splitlines() if re.match(r"#{1,6} ", line)]


def number(word: str) -> float:
    """``1e-2``, ``10⁻²``, ``3·10⁻³`` or ``1024`` as a float."""
    word = word.translate(SUPERSCRIPT)
    if "10-" in word and "e" not in word:
        mantissa, _, exponent = word.partition("10-")
        return float(mantissa.rstrip("·") or 1) * 10.0 ** -int(exponent)
    return float(word)


def lpft_default_paragraph() -> str:
    text = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    section = text.split("### §15.6", 1)[1].split("\n## ", 1)[0]
    return section.split("**The default.**", 1)[1].split("\n\n", 1)[0]


@pytest.mark.parametrize("document", DOCS, ids=lambda path: path.name)
def test_no_heading_is_a_date_or_a_session(document: Path) -> None:
    dated = [h for h in headings(document.read_text(encoding="utf-8")) if NOTEBOOK_HEADING.search(h)]
    assert not dated, (f"{document.name}: headings titled by a date or a session (name what the section "
                       f"documents): {dated}")


@pytest.mark.parametrize("name", sorted(MAX_LINES))
def test_the_long_documents_stay_within_their_bound(name: str) -> None:
    lines = len((REPO / "docs" / name).read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES[name], (f"docs/{name} has {lines} lines (at most {MAX_LINES[name]}): move history to "
                                      "a report")


def test_the_stated_lpft_flags_are_the_recipe() -> None:
    """The flags design.md §15.6 quotes for the default are LPFT_RECIPE's values."""
    paragraph = lpft_default_paragraph()
    for flag in LPFT_FLAGS:
        stated = re.search(rf"{flag} (\S+)", paragraph)
        assert stated, f"docs/design.md §15.6 does not state {flag}"
        assert number(stated.group(1)) == number(recipe_value(LPFT_RECIPE, flag)), (
            f"docs/design.md §15.6 states {flag} {stated.group(1)}, the recipe {recipe_value(LPFT_RECIPE, flag)}")


def test_the_stated_lpft_prose_is_the_recipe() -> None:
    """The sentence that names the default in words: 'T Poisson batches of expected size B …, AdamW η (B)'."""
    paragraph = " ".join(lpft_default_paragraph().split())
    stated = re.search(r"(\d+) Poisson batches of expected size (\d+).*?AdamW (\S+) \(B\)", paragraph)
    assert stated, "docs/design.md §15.6 no longer names the default's steps, batch and learning rate in words"
    steps, batch, rate = stated.groups()
    assert int(steps) == int(recipe_value(LPFT_RECIPE, "--max_steps"))
    assert int(batch) == int(recipe_value(LPFT_RECIPE, "--per_device_train_batch_size"))
    assert number(rate) == number(recipe_value(LPFT_RECIPE, "--learning_rate"))


def test_the_parsers_read_what_the_documents_write() -> None:
    assert number("10⁻²") == pytest.approx(1e-2) and number("3·10⁻³") == pytest.approx(3e-3)
    assert number("1e-2") == pytest.approx(1e-2) and number("1024") == 1024
    text = "# Title\n```bash\n# not a heading\n```\n## A 2026-12-05 run\n"
    assert headings(text) == ["# Title", "## A 2026-12-05 run"]
    assert NOTEBOOK_HEADING.search("## Ending the answer (2026-12-05, eighth session)")
    assert not NOTEBOOK_HEADING.search("## Ending the answer")


def test_the_data_size_table_of_the_workflow_is_the_reports() -> None:
    """docs/workflow.md "How much data" quotes the data-size study's table as its report has it (regenerated from the
    stored units by ``python -m benchmarks.studies.data_size --report-only``)."""
    workflow = (REPO / "docs" / "workflow.md").read_text(encoding="utf-8")
    quoted = workflow.split("<!-- data-size table -->\n", 1)[1].split("<!-- end data-size table -->", 1)[0]
    report = (REPO / "benchmarks" / "reports" / "data_size" / "REPORT.md").read_text(encoding="utf-8")
    assert quoted.strip() and quoted.strip() == report.split("\n\n")[2].strip()
