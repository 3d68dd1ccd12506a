"""The answer-end study: it reads the adapters a variant (no answer end, public anchor) kept through the
causal_recipe study's units, refuses a seed without them, and sets each unit beside the stored units of the pair
that learnt the answer's end."""

import argparse
import json
from pathlib import Path

import pytest

from benchmarks import harness
from benchmarks.studies.answer_end import CANDIDATE, TASKS, AnswerEnd

TASKS = list(TASKS)


def recipe_unit(kept, task, variant, epsilon=8.0, keep=True):
    """A stored test unit of the causal_recipe study, its adapter kept in ``kept`` (or not)."""
    name = f"{task}-{CANDIDATE}+{variant}-test-eps{epsilon:g}-seed0"
    if keep:
        (kept / name / task / "adapter").mkdir(parents=True)
    return {"name": name, "settings": {"stage": "train", "task": task, "candidate": f"{CANDIDATE}+{variant}",
                                       "split": "test", "epsilon": epsilon, "seed": 0}}


def plan(monkeypatch, recipe_units, *argv):
    monkeypatch.setattr(harness, "stored", lambda study, schema: recipe_units if study == "causal_recipe" else [])
    parser = argparse.ArgumentParser()
    AnswerEnd().add_arguments(parser)
    return [(u.settings["what"], u.settings["tasks"]) for u in AnswerEnd().plan(parser.parse_args(list(argv)))]


NO_END = ("--train_answer_end", "false")


def test_a_seed_without_every_tasks_kept_adapter_is_refused_naming_kept(tmp_path: Path, monkeypatch):
    units = [recipe_unit(tmp_path, "bbc_news", "no_answer_end"),
             recipe_unit(tmp_path, "election_tweets", "no_answer_end", keep=False)]
    with pytest.raises(ValueError, match=r"--kept .*\['election_tweets'\]"):
        plan(monkeypatch, units, "--kept", str(tmp_path))


def test_the_non_private_unit_scores_only_the_tasks_whose_twin_is_kept(tmp_path: Path, monkeypatch):
    units = [recipe_unit(tmp_path, t, "no_answer_end") for t in TASKS]
    units.append(recipe_unit(tmp_path, "bbc_news", "no_answer_end", float("inf")))
    assert plan(monkeypatch, units, "--kept", str(tmp_path), "--methods", "ties") == [
        ("zero_shot", TASKS), ("individual", TASKS), ("ties", TASKS), ("non_private", ["bbc_news"])]


def test_a_variant_that_learnt_the_end_runs_no_zero_shot_unit_of_its_own(tmp_path: Path, monkeypatch):
    units = [recipe_unit(tmp_path, t, "public_anchor") for t in TASKS]
    assert plan(monkeypatch, units, "--variant", "public_anchor", "--kept", str(tmp_path), "--methods", "ties") == [
        ("individual", TASKS), ("ties", TASKS)]


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
    left_out = {"variant": "no_answer_end", "seed": 0, "answer_end_scored": {t: False for t in TASKS}}
    units = [left_out | {"what": "zero_shot", "tasks": TASKS, "scores": scores(0.3)},
             left_out | {"what": "individual", "tasks": TASKS, "scores": scores(0.7)},
             left_out | {"what": "ties", "tasks": TASKS, "scores": scores(0.62),
                         "generation": {t: generation(0.0, 0.8) for t in TASKS}},
             left_out | {"what": "non_private", "tasks": ["bbc_news"], "scores": {"bbc_news": scores(0.8)["bbc_news"]}},
             *({"variant": "public_anchor", "seed": 0, "what": what, "tasks": TASKS, "scores": scores(accuracy),
                "answer_end_scored": {t: True for t in TASKS}} for what, accuracy in (("individual", 0.65),
                                                                                     ("ties", 0.55)))]
    text = AnswerEnd().report([{"name": "", "settings": {}, "result": u} for u in units])["ANSWER_END.md"]
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




def test_its_variants_and_candidate_are_the_causal_recipe_studys():
    """The variant it scores without the answer's end is the one whose flags leave the end out of the loss."""
    from benchmarks.studies import causal_recipe
    from benchmarks.studies.answer_end import LEFT_OUT, VARIANTS

    assert set(VARIANTS) <= set(causal_recipe.VARIANTS) and CANDIDATE in causal_recipe.CANDIDATES
    for variant in VARIANTS:
        flags = causal_recipe.VARIANTS[variant]
        assert (variant == LEFT_OUT) == any(pair == NO_END for pair in zip(flags, flags[1:]))
