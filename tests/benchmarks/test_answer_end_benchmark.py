"""The answer-end benchmark: it reads the adapters a variant (no answer end, public anchor) kept, refuses a seed
without them, and sets each unit beside the stored units of the pair that learnt the answer's end."""

import json
import math
from pathlib import Path

import pytest

from benchmarks import answer_end, harness
from benchmarks.studies import causal_merge, causal_recipe

TASKS = list(causal_merge.TASKS)


def test_the_kept_adapters_are_the_variants_report_units(tmp_path: Path):
    assert answer_end.kept_run(tmp_path, "bbc_news", 1).parent.name == \
        "bbc_news-b1600_t12_lr1e-2+no_answer_end-test-eps8-seed1"
    assert answer_end.kept_run(tmp_path, "bbc_news", 0, variant="public_anchor").parent.name == \
        "bbc_news-b1600_t12_lr1e-2+public_anchor-test-eps8-seed0"
    assert set(answer_end.VARIANTS) <= set(causal_recipe.VARIANTS)
    assert not answer_end.learns_the_end("no_answer_end") and answer_end.learns_the_end("public_anchor")


def test_a_seed_without_every_tasks_kept_adapter_is_refused_naming_kept(tmp_path: Path, capsys):
    (answer_end.kept_run(tmp_path, "bbc_news", 0) / "adapter").mkdir(parents=True)
    with pytest.raises(SystemExit):
        answer_end.main(["--kept", str(tmp_path), "--base", str(tmp_path / "base"), "--units-dir",
                         str(tmp_path / "units")])
    error = capsys.readouterr().err
    assert "--kept" in error and "['election_tweets']" in error
    assert not (tmp_path / "units").exists()  # nothing ran


def generation(end_first: float, begins: float) -> dict:
    return {"n": 200, "end_of_sequence_first": end_first, "generation_is_a_verbaliser": begins / 2,
            "generation_begins_with_a_verbaliser": begins, "generation_begins_with_gold": begins / 4}


def test_the_report_sets_each_unit_beside_the_pair_that_learnt_the_answers_end(tmp_path: Path, monkeypatch):
    (tmp_path / "causal_recipe").mkdir()
    monkeypatch.setattr(harness, "REPORTS", tmp_path)

    def scores(accuracy: float) -> dict:
        return {t: {"accuracy": accuracy, "num_examples": 9} for t in TASKS}

    learnt = [{"name": name, "settings": {}, "result": {"scores": scores(accuracy)}}
              for name, accuracy in (("zero_shot", 0.4), ("dp_sgd-seed0-individual", 0.6), ("dp_sgd-seed0-ties", 0.5))]
    monkeypatch.setattr(harness, "stored", lambda study, schema: learnt if study == "causal_merge" else [])
    (tmp_path / "causal_recipe" / "generation_ties.json").write_text(
        json.dumps({t: generation(1.0, 0.0) for t in TASKS}))
    units = [{"seed": 0, "what": "zero_shot", "tasks": TASKS, "scores": scores(0.3)},
             {"seed": 0, "what": "individual", "tasks": TASKS, "scores": scores(0.7)},
             {"seed": 0, "what": "ties", "tasks": TASKS, "scores": scores(0.62),
              "generation": {t: generation(0.0, 0.8) for t in TASKS}},
             {"seed": 0, "what": "non_private", "tasks": ["bbc_news"], "scores": {"bbc_news": scores(0.8)["bbc_news"]}},
             *({"variant": "public_anchor", "seed": 0, "what": what, "tasks": TASKS, "scores": scores(accuracy),
                "answer_end_scored": {t: True for t in TASKS}} for what, accuracy in (("individual", 0.65),
                                                                                     ("ties", 0.55)))]
    text = answer_end.write_report(units, tmp_path / "ANSWER_END.md")
    # each pair's gain is over the zero-shot base scored its way (0.4 with the end, 0.3 without), a merge's share of
    # it is against that pair's own adapters (0.6, 0.7), an adapter's against its non-private twin's (0.8)
    assert "| ties | 0 | bbc_news | learnt (stored) | with the end | 50.0 | +10.0 | — | 50% | 100 | 0 | 0 | 0 |" in text
    assert "| ties | 0 | bbc_news | left out | verbaliser alone | 62.0 | +32.0 | — | 80% | 0 | 40 | 80 | 20 |" in text
    assert "| individual | 0 | bbc_news | left out | verbaliser alone | 70.0 | +40.0 | 80% | — |" in text
    assert "| individual | 0 | election_tweets | left out | verbaliser alone | 70.0 | +40.0 | — | — |" in text
    assert "| zero_shot | 0 | bbc_news | learnt (stored) | with the end | 40.0 | +0.0 | — | — |" in text
    assert "| non_private | 0 | bbc_news | left out | verbaliser alone | 80.0 | +50.0 | — | — |" in text
    assert "| non_private | 0 | bbc_news | learnt" not in text and "| non_private | 0 | election_tweets" not in text
    # the anchored pair learnt the end: scored with it, against the learnt pair's zero-shot (0.4); the learnt pair's
    # rows stay once per model
    assert "| ties | 0 | bbc_news | learnt, anchored | with the end | 55.0 | +15.0 | — | 60% |" in text
    assert "| individual | 0 | bbc_news | learnt, anchored | with the end | 65.0 | +25.0 | — | — |" in text
    assert text.count("| ties | 0 | bbc_news | learnt (stored) |") == 1
    assert (text.index("| ties | 0 | bbc_news | learnt (stored)") < text.index("| ties | 0 | bbc_news | left out")
            < text.index("| ties | 0 | bbc_news | learnt, anchored"))
    assert (text.index("| zero_shot |") < text.index("| individual |") < text.index("| non_private |")
            < text.index("| ties |"))
    assert (tmp_path / "ANSWER_END.md").read_text() == text


def test_the_non_private_unit_scores_only_the_tasks_whose_twin_is_kept(tmp_path: Path, monkeypatch):
    for task in TASKS:
        (answer_end.kept_run(tmp_path, task, 0) / "adapter").mkdir(parents=True)
    (answer_end.kept_run(tmp_path, "bbc_news", 0, math.inf) / "adapter").mkdir(parents=True)
    calls = []
    monkeypatch.setattr(answer_end, "run_unit", lambda kept, base, tasks, seed, what, *_: calls.append((what, tasks)))
    monkeypatch.setattr(answer_end, "REPORT_DIR", tmp_path)
    assert answer_end.main(["--kept", str(tmp_path), "--base", str(tmp_path / "base"), "--methods", "ties",
                            "--units-dir", str(tmp_path / "units")]) == 0
    assert calls == [("zero_shot", TASKS), ("individual", TASKS), ("ties", TASKS), ("non_private", ["bbc_news"])]
    assert answer_end.kept_run(tmp_path, "bbc_news", 0, math.inf).parent.name.endswith("-test-epsinf-seed0")


def test_a_variant_that_learnt_the_end_runs_no_zero_shot_unit_of_its_own(tmp_path: Path, monkeypatch):
    for task in TASKS:
        (answer_end.kept_run(tmp_path, task, 0, variant="public_anchor") / "adapter").mkdir(parents=True)
    calls = []
    monkeypatch.setattr(answer_end, "run_unit", lambda kept, base, tasks, seed, what, work, samples, path, variant:
                        calls.append((what, path.name, variant)))
    monkeypatch.setattr(answer_end, "REPORT_DIR", tmp_path)
    assert answer_end.main(["--variant", "public_anchor", "--kept", str(tmp_path), "--base", str(tmp_path / "base"),
                            "--methods", "ties", "--units-dir", str(tmp_path / "units")]) == 0
    assert calls == [("individual", "public_anchor-seed0-individual.json", "public_anchor"),
                     ("ties", "public_anchor-seed0-ties.json", "public_anchor")]
