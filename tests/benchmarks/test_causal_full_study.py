"""The full-size causal chain: its plan in the documented order, the stored units done, the report regenerated."""

import argparse

from benchmarks import harness
from benchmarks.studies.causal_full import CausalFull


def test_the_documented_run_plans_the_stored_units_first_and_the_report_is_regenerated():
    parser = argparse.ArgumentParser()
    CausalFull().add_arguments(parser)
    args = parser.parse_args(["--nonprivate_tasks", "election_tweets,bbc_news", "--merge_eval_samples", "500"])
    plan = CausalFull().plan(args)
    assert [u.name for u in plan][:4] == ["train-runs_causal-rotten_tomatoes", "train-runs_causal-election_tweets",
                                          "train-runs_causal-bbc_news", "merge-task_arithmetic"]
    store = harness.Store(harness.REPORTS / "causal_full" / "units", CausalFull.schema)
    assert {u.name for u in plan if store.load(u) is not None} == {
        "train-runs_causal-rotten_tomatoes", "train-runs_causal-election_tweets", "train-runs_causal-bbc_news",
        "merge-task_arithmetic", "train-runs_nonprivate-bbc_news"}
    text = CausalFull().report(store.results())["CAUSAL_FULL.md"]
    assert text == (harness.REPORTS / "causal_full" / "CAUSAL_FULL.md").read_text()
    assert "| bbc_news | 0.2584 | 0.3371 | 0.9393 | 0.1933 |" in text
