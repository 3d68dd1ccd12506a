"""Help that says what runs: every verb's printed defaults are the ones its code uses, ``similarity --help`` names
what grouping uses, and the README's step 2 names what ``hf-dpmerge merge`` writes at the root of ``merged/``."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np
import pytest

from hf_dpmerge.cli.main import build_parser
from hf_dpmerge.merging.planning.merge_groups import DEFAULT_THRESHOLD, merge_groups
from hf_dpmerge.merging.planning.task_similarity import SimilarityReport
from hf_dpmerge.scripts.task_folders import ROOT_NOTE

REPO = Path(__file__).resolve().parents[2]
VERBS = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices


def printed_defaults(parser: argparse.ArgumentParser) -> list[tuple[str, object, str]]:
    """(flag, the default argparse uses, the default its help prints) of every flag with a concrete default."""
    rows = []
    for action in parser._actions:
        match = re.search(r"\(default:? ('[^']*'|[^);,]+)", action.help or "")
        if match and action.default is not None and not isinstance(action.default, bool):
            rows.append((action.option_strings[0] if action.option_strings else action.dest, action.default,
                         match.group(1).strip().strip("'")))
    return rows


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_the_defaults_each_verb_prints_are_the_ones_it_uses(verb: str) -> None:
    for flag, default, printed in printed_defaults(VERBS[verb]):
        if isinstance(default, int | float):
            assert float(printed) == pytest.approx(float(default)), (verb, flag, printed, default)
        else:
            assert printed == str(default), (verb, flag, printed, default)


def test_similarity_help_says_grouping_uses_the_noise_aware_cosine_as_merge_groups_does() -> None:
    """Raw cosine 0.05, noise-aware 0.5 [0.45, 0.55]: grouping at the default threshold joins the pair, as the
    help says; a pair whose noise-aware cosine is undefined groups by its raw cosine."""
    help_text = " ".join(VERBS["similarity"].format_help().split())
    assert "Grouping uses the noise-aware cosine" in help_text
    assert "the raw one for a pair where it is undefined" in help_text
    assert f"(default: {DEFAULT_THRESHOLD})" in help_text and "noise-aware cosine (the raw one where it is" in help_text

    def report(denoised: float) -> SimilarityReport:
        pair = np.array([[1.0, 0.05], [0.05, 1.0]])
        corrected = np.array([[1.0, denoised], [denoised, 1.0]])
        interval = np.stack([corrected - 0.05, corrected + 0.05], axis=-1)
        return SimilarityReport(["a", "b"], ["a", "b"], [1.0, 1.0], pair, np.zeros((2, 2)), [0.8, 0.8],
                                corrected, interval)

    assert 0.05 < DEFAULT_THRESHOLD < 0.45
    assert merge_groups(report(0.5)) == [["a", "b"]]
    assert merge_groups(report(float("nan"))) == [["a"], ["b"]]


def test_readme_step_2_says_what_merge_writes_at_the_root() -> None:
    step = re.search(r"^2\. `hf-dpmerge merge`.*?(?=^3\. )", (REPO / "README.md").read_text(), re.S | re.M).group(0)
    assert "placeholder head:" not in step and f"`{ROOT_NOTE}`" in step and "without" in step


@pytest.mark.parametrize("argv", [["--help"], ["--version"]])
def test_the_top_level_help_and_version_import_no_verb_and_no_heavy_library(argv: list[str]) -> None:
    """``hf-dpmerge --help``/``--version`` start in well under a second: neither imports a verb module nor torch,
    transformers, mergekit, peft or datasets (checked on the modules the process imported, not by timing)."""
    import subprocess
    import sys

    code = ("import sys\nfrom hf_dpmerge.cli.main import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n"
            "    pass\nprint('MODULES', *sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'torch', 'transformers', 'mergekit', 'peft', 'datasets'} or m.endswith('_command')))")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "MODULES"
    if argv == ["--help"]:
        assert all(verb in done.stdout for verb in ("train", "merge", "evolve")) and "``" not in done.stdout
