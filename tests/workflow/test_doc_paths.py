"""The documents name only what the repository holds, and cite nothing outside it.

**Paths.** In README.md and docs/*.md every link target and every path-like word of an inline code span or a
```bash block is checked. Link targets are relative to the document and must exist (URLs, ``#…`` skipped). A word
is path-like when it holds a ``/`` or ends in .py, .sh, .md, .yaml, .yml or .json; URLs, absolute or home paths,
placeholders (``<``, ``$``, ``{``) and options are skipped, and plain prose counts for ``/``-words ending in .py,
.sh or .md. A .py/.sh/.md name must be the tail of a tracked file (``training/recipe.py``, ``recipe.py``) unless
its first component names no folder of the repository (``merged/tuned/README.md``: a card a command writes). Any
other ``/``-word whose first component is a top-level entry (``merge_configs/dp.yaml``, a glob that must match) must
exist; other first components are command outputs (``runs/…``) or Hub ids (``owner/name``): not checked. Bare
names (``dp_privacy.json``) are files a command writes: not checked.

**Citations.** README.md, docs/*.md and the .py files under hf_dpmerge/, benchmarks/, examples/ and tests/ cite
nothing outside the repository: no shared folder beside it, no notes that do not ship with it, no issue tracker
numbers. Cite docs/design.md §N, or a paper by its authors and venue.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SOURCE_FOLDERS = ("hf_dpmerge", "benchmarks", "examples", "tests")

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
PROSE_SOURCE = re.compile(r"(?<![\w/`.-])((?:[\w.-]+/)+[\w.-]+\.(?:py|sh|md))\b")
PATH_SUFFIXES = (".py", ".sh", ".md", ".yaml", ".yml", ".json")
SOURCE_SUFFIXES = (".py", ".sh", ".md")


@cache
def tracked_files() -> tuple[str, ...]:
    """Tracked files, plus untracked ones not ignored (a new document before its commit)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    return tuple(name for name in listed if (REPO / name).exists())


def is_tail_of_a_tracked_file(name: str) -> bool:
    return any(path == name or path.endswith("/" + name) for path in tracked_files())


@cache
def folder_names() -> frozenset[str]:
    """The name of every folder of the repository, at any depth."""
    return frozenset(part for path in tracked_files() for part in path.split("/")[:-1])


def candidate_words(text: str) -> list[str]:
    """Path-like words of the inline code spans and ```bash blocks of a markdown ``text``."""
    spans = [match.group(1) for match in INLINE_CODE.finditer(FENCE.sub("", text))]
    spans += [match.group(2) for match in FENCE.finditer(text) if match.group(1) in ("bash", "sh")]
    words = []
    for span in spans:
        for word in span.split():
            word = word.strip("\"'()[],;:.").removeprefix("./")
            if "=" in word:
                word = word.rpartition("=")[2]
            if not word or word.startswith(("-", "/", "~")) or "://" in word or any(c in word for c in "<${…"):
                continue
            if "/" in word or word.endswith(PATH_SUFFIXES):
                words.append(word)
    prose = INLINE_CODE.sub("", FENCE.sub("", LINK.sub("", text)))
    return words + [match.group(1).removeprefix("./") for match in PROSE_SOURCE.finditer(prose)]


def missing_word(word: str, top_level: set[str]) -> bool:
    if word.endswith(SOURCE_SUFFIXES):
        if "/" in word and word.split("/")[0] not in folder_names():
            return False  # a file a command writes into its output folder
        return not is_tail_of_a_tracked_file(word)
    if "/" not in word or word.split("/")[0] not in top_level:
        return False  # a command's output or a Hub id (module docstring)
    if "*" in word:
        return not list(REPO.glob(word))
    return not (REPO / word).exists()


def missing_paths(text: str, folder: Path) -> list[str]:
    """The repository paths a markdown ``text`` in ``folder`` names that do not exist."""
    top_level = {name.split("/")[0] for name in tracked_files()}
    missing = []
    for match in LINK.finditer(text):
        target = match.group(1).split("#")[0]
        if target and "://" not in target and not target.startswith("mailto:") and not (folder / target).exists():
            missing.append(target)
    missing += [word for word in candidate_words(text) if missing_word(word, top_level)]
    return sorted(set(missing))


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(REPO)))
def test_every_path_a_document_names_exists(document: Path) -> None:
    assert missing_paths(document.read_text(encoding="utf-8"), document.parent) == []


def test_the_path_check_reports_a_made_up_path() -> None:
    text = ("Run `python hf_dpmerge/no_such_module.py`, read [the notes](no_such_notes.md) and "
            "`merge_configs/no_such.yaml`; see `training/gone.py` and (tests/merging/test_gone.py).\n"
            "```bash\nmergekit-yaml merge_configs/also_missing.yaml merged\n```\n")
    assert missing_paths(text, REPO / "docs") == [
        "hf_dpmerge/no_such_module.py", "merge_configs/also_missing.yaml", "merge_configs/no_such.yaml",
        "no_such_notes.md", "tests/merging/test_gone.py", "training/gone.py"]


def test_the_path_check_skips_outputs_hub_ids_and_urls() -> None:
    text = ("`runs/<task>/adapter/`, `merged-hub/`, `runs/eval/results.json`, `dp_privacy.json`, "
            "`sentence-transformers/all-MiniLM-L6-v2`, [paper](https://arxiv.org/abs/1), `--runs_dir runs`, "
            "[design](design.md), `merge_configs/*.yaml`, `hf_dpmerge/training/recipe.py`, `recipe.py`, "
            "`merged/tuned/README.md`, tests/workflow/test_doc_paths.py")
    assert missing_paths(text, REPO / "docs") == []


# Built from pieces so that this file does not match them itself.
OUTSIDE_CITATIONS = re.compile("|".join([
    r"\.\./" + "shared",
    "ASSETS" + r"\.md",
    "DESIGN" + "-NOTES",
    r"\bhand" + r"book\b",
    r"\bissues?\s*#?\s*\d+",
    r"\bthe " + r"issue(?:'s)?\b",
]), re.I)


def citation_files() -> list[Path]:
    files = list(DOCUMENTS)
    for folder in SOURCE_FOLDERS:
        files += sorted(path for path in (REPO / folder).rglob("*.py") if "__pycache__" not in path.parts)
    return files


def outside_citations(text: str) -> list[str]:
    return [match.group(0) for match in OUTSIDE_CITATIONS.finditer(text)]


def test_nothing_cites_what_the_repository_does_not_hold() -> None:
    hits = [
        f"{path.relative_to(REPO)}:{text[:match.start()].count(chr(10)) + 1}: {match.group(0)!r}"
        for path in citation_files()
        for text in [path.read_text(encoding="utf-8")]
        for match in OUTSIDE_CITATIONS.finditer(text)
    ]
    assert hits == []


def test_the_citation_check_catches_each_kind() -> None:
    dots = ".."
    text = (f"see {dots}/shared/x, " + "ASSETS" + ".md, " + "DESIGN" + "-NOTES §3, the hand" + "book §2.2, "
            + "issue " + "17, the " + "issue's targets")
    assert len(outside_citations(text)) == 6
    assert outside_citations("docs/design.md §13; Steinke, Nasr & Jagielski, NeurIPS 2023") == []
