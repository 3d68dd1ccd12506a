"""The noise re-runs study: one unit of every re-run, its report regenerated from the stored unit."""

import argparse

import pytest

from benchmarks import harness
from benchmarks.studies.noise_reruns import KINDS, NoiseReruns


def plan(*argv):
    parser = argparse.ArgumentParser()
    NoiseReruns().add_arguments(parser)
    return NoiseReruns().plan(parser.parse_args(list(argv)))


def test_one_unit_holds_every_rerun_and_its_flags():
    (unit,) = plan("--task", "bbc_news", "--reruns", "3", "--train-flags", "--max_steps 5")
    assert unit.name == "bbc_news-3reruns"
    assert unit.settings == {"task": "bbc_news", "reruns": 3, "flags": ["--max_steps", "5"]}
    with pytest.raises(ValueError, match="two re-runs"):
        plan("--reruns", "1")


def test_the_stored_unit_regenerates_the_committed_report():
    path = harness.REPORTS / "noise_reruns" / "NOISE_RERUNS.md"
    stored = harness.stored("noise_reruns", NoiseReruns.schema)
    assert list(stored[0]["result"]["kinds"]) == list(KINDS)
    assert NoiseReruns().report(stored)["NOISE_RERUNS.md"] == path.read_text()
