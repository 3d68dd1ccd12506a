"""The answer-end benchmark: it reads the adapters the no-answer-end variant kept, refuses a seed without them, and
sets each unit beside the stored units of the pair that learnt the answer's end."""

import json
from pathlib import Path

import pytest

from benchmarks import answer_end, causal_merge, causal_recipe

TASKS = list(causal_merge.TASKS)


def test_the_kept_adapters_are_the_no_answer_end_variants_report_units(tmp_path: Path):
    assert answer_end.kept_run(tmp_path, "bbc_news", 1).parent.name == \
        "bbc_news-b1600_t12_lr1e-2+no_answer_end-test-eps8-seed1"
    assert answer_end.VARIANT.partition("+")[2] in causal_recipe.VARIANTS


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
    report_dir = tmp_path / "causal-recipe"
    (report_dir / "merge-units").mkdir(parents=True)
    monkeypatch.setattr(causal_merge, "REPORT_DIR", report_dir)
    learnt = {"seed": 0, "what": "ties", "scores": {t: {"accuracy": 0.5, "num_examples": 9} for t in TASKS}}
    (report_dir / "merge-units" / "dp_sgd-seed0-ties.json").write_text(json.dumps(learnt))
    (report_dir / "generation_ties.json").write_text(json.dumps({t: generation(1.0, 0.0) for t in TASKS}))
    unit = {"seed": 0, "what": "ties", "tasks": TASKS,
            "scores": {t: {"accuracy": 0.62, "num_examples": 9} for t in TASKS},
            "generation": {t: generation(0.0, 0.8) for t in TASKS}}
    text = answer_end.write_report([unit], tmp_path / "ANSWER_END.md")
    assert "| ties | 0 | bbc_news | learnt (stored) | 50.0 | 100 | 0 | 0 | 0 |" in text
    assert "| ties | 0 | bbc_news | left out | 62.0 | 0 | 40 | 80 | 20 |" in text
    assert (tmp_path / "ANSWER_END.md").read_text() == text
