"""The federated strategies study: one unit per server variant on shared flags, reported in the variants' order."""

import argparse

import pytest

from benchmarks.studies.federated import VARIANTS, Federated


def plan(*argv):
    parser = argparse.ArgumentParser()
    Federated().add_arguments(parser)
    return Federated().plan(parser.parse_args(list(argv)))


def test_every_variant_shares_the_federation_and_differs_in_its_server_flags_alone():
    units = plan("--task", "bbc_news")
    assert [u.name for u in units] == list(VARIANTS)
    assert all(u.settings["common"] == units[0].settings["common"] for u in units)
    assert units[0].settings["common"][-4:] == ["--task", "bbc_news", "--model_name_or_path", "runs/base"]
    with pytest.raises(ValueError, match="unknown"):
        plan("--variants", "fedavg,fedsgd")


def test_the_report_lists_each_variants_rounds_test_and_time():
    history = [{"round": k, "accuracy": 0.5 + 0.01 * k} for k in range(3)]
    stored = [{"name": u.name, "settings": u.settings,
               "result": {"test": {"accuracy": 0.6}, "history": history, "epsilon": 7.99, "seconds": 12.4}}
              for u in reversed(plan("--variants", "ties,fedavg"))]
    text = Federated().report(stored)["FEDERATED.md"]
    rows = [line for line in text.splitlines() if line.startswith("| fedavg") or line.startswith("| ties")]
    assert rows == ["| fedavg | (Flower's FedAvg) | 0.5000 | 0.5100 | 0.5200 | 0.6000 | 7.99 | 12 |",
                    "| ties | --aggregation ties | 0.5000 | 0.5100 | 0.5200 | 0.6000 | 7.99 | 12 |"]
