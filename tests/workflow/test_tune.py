"""hf-dpmerge tune end to end on tiny adapters of real packaged tasks: merge, score on validation, select."""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from pathlib import Path

import datasets
import numpy as np
import pytest
import yaml

from hf_dpmerge.analysis.evaluation import predict_logits
from hf_dpmerge.analysis.task_models import load_merged_with_head
from hf_dpmerge.analysis.task_run import find_tokenizer, load_split, task_runs
from hf_dpmerge.cli.main import main
from hf_dpmerge.data.load import load_task
from hf_dpmerge.data.metrics import compute_metrics, predictions_from_logits
from hf_dpmerge.records.fingerprint import adapter_fingerprint
from hf_dpmerge.scripts import tune as tune_script
from hf_dpmerge.scripts.tune import (
    GridAxis,
    candidate_configs,
    correct_counts,
    parse_validation_size,
    public_validation_size,
    scoring_sets,
)
from hf_dpmerge.training.encoder_adapter import export_encoder_adapter
from tests.utils.merging_builders import lora_config_yaml
from tests.utils.records import privacy_record
from tests.utils.runs_builders import save_fake_adapter
from tests.utils.tiny_models import save_tiny_bert

TASKS = {"bbc_news": 5, "election_tweets": 2}
LAMBDAS = (0.0, 1.0, 2.0)


def _save_adapter(runs: Path, task: str, labels: int, seed: int, folder: str | None = None, **record) -> None:
    """A LoRA adapter with large deltas (predictions move with λ), its record (ε = 4 + seed; ``record`` overrides)
    and encoder export, in ``runs/<folder or task>``."""
    run = runs / (folder or task)
    save_fake_adapter(runs / "base", run / "adapter", labels, seed)
    privacy_record(task, epsilon=4.0 + seed, extra={"max_length": 32}, seeded=False, **record).save(run / "adapter")
    export_encoder_adapter(run / "adapter", run / "encoder_adapter")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tune")
    save_tiny_bert(root / "runs" / "base")
    for seed, (task, labels) in enumerate(TASKS.items(), start=1):
        _save_adapter(root / "runs", task, labels, seed)
    adapters = [f"./runs/{task}/encoder_adapter" for task in TASKS]
    (root / "ta.yaml").write_text(lora_config_yaml("task_arithmetic", "./runs/base", adapters, "parameters:\n"
                                                   "  lambda: 0.3\n  weight: 1.0\n"))
    return root


def _validation_sets(workdir: Path) -> dict[str, datasets.Dataset]:
    tokenizer = find_tokenizer([workdir / "runs" / "base"])
    return {run.name: load_split(run, "validation", tokenizer) for run in task_runs(workdir / "runs", list(TASKS))}


def _validation_accuracy(workdir: Path, merged: Path) -> float:
    """Task-averaged validation accuracy computed independently through compute_metrics."""
    scores = []
    for run in task_runs(workdir / "runs", list(TASKS)):
        tokenizer = find_tokenizer([workdir / "runs" / "base"])
        data = load_split(run, "validation", tokenizer)
        logits = predict_logits(load_merged_with_head(merged, run.adapter_dir, run.spec), data, tokenizer)
        predictions = predictions_from_logits(run.spec, logits)
        scores.append(compute_metrics(run.spec, predictions, np.asarray(data["labels"]))["accuracy"])
    return float(np.mean(scores))


def test_grid_parsing_and_candidates() -> None:
    config = {"merge_method": "ties", "models": [{"model": "a"}, {"model": "b", "parameters": {"weight": 1}}]}
    grid = [GridAxis.parse("lambda=0.3,1"), GridAxis.parse("1.weight=0.5,2"), GridAxis.parse("density=0.2")]
    candidates = candidate_configs(config, grid)
    assert [settings for settings, _ in candidates] == [
        {"lambda": 0.3, "models[1].weight": 0.5, "density": 0.2},
        {"lambda": 0.3, "models[1].weight": 2, "density": 0.2},
        {"lambda": 1, "models[1].weight": 0.5, "density": 0.2}, {"lambda": 1, "models[1].weight": 2, "density": 0.2},
    ]
    last = candidates[-1][1]
    assert last["parameters"] == {"lambda": 1, "density": 0.2} and last["models"][1]["parameters"] == {"weight": 2}
    assert config["models"][1]["parameters"] == {"weight": 1}  # the base config is not modified
    for bad in ("lambda", "x.weight=1", "lambda="):
        with pytest.raises(ValueError, match="--grid"):
            GridAxis.parse(bad)
    with pytest.raises(ValueError, match="fewer than 2 candidate"):
        candidate_configs(config, [GridAxis.parse("lambda=0.3")])
    with pytest.raises(ValueError, match="out of range"):
        candidate_configs(config, [GridAxis.parse("2.weight=1,2")])


def test_validation_size_parsing_and_uniform_subsampling() -> None:
    assert parse_validation_size("500") == 500
    assert parse_validation_size("a=10, b=20") == {"a": 10, "b": 20}
    for bad in ("many", "a=1,b", "a=1,a=2", "a=x"):
        with pytest.raises(ValueError, match="--validation_size"):
            parse_validation_size(bad)
    assert public_validation_size(300, ["a", "b"]) == {"a": 300, "b": 300}
    assert public_validation_size({"b": 2, "a": 1}, ["a", "b"]) == {"a": 1, "b": 2}
    for bad in ({"a": 1}, {"a": 1, "b": 2, "c": 3}, 0, {"a": 1, "b": 0}, 2.5):
        with pytest.raises(ValueError, match="--validation_size"):
            public_validation_size(bad, ["a", "b"])

    validation = {"small": datasets.Dataset.from_dict({"x": list(range(3))}),
                  "large": datasets.Dataset.from_dict({"x": list(range(5))})}
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(200):  # uniformity itself: merging/test_private_selection.py (subsample_indices)
        sets = scoring_sets(validation, {"small": 4, "large": 2}, rng)
        assert sets["small"]["x"] == [0, 1, 2]  # fewer than n: kept whole (the missing ones count as wrong)
        assert len(set(sets["large"]["x"])) == 2
        seen.add(tuple(sets["large"]["x"]))
    assert seen == set(itertools.combinations(range(5), 2))  # P(some pair never drawn) < 10·0.9²⁰⁰ ≈ 7e-9


def test_the_selection_record_holds_the_fingerprint_of_each_adapter_it_was_made_with(workdir, tmp_path) -> None:
    """What push checks a release against: the scoring setup fingerprints each run's adapter (weights and
    record) before any candidate is scored, and the selection record carries them."""
    runs = task_runs(workdir / "runs", list(TASKS))
    setup = tune_script.prepare_scoring(runs, tmp_path / "out", epsilon=1.0, composition="sequential",
                                        base_dir=workdir / "runs" / "base", validation_size=5, batch_size=8,
                                        device="cpu", rng=np.random.default_rng(0), seeded=False, command="tune")
    record = setup.selection_record("exponential", [{"lambda": 0.0}, {"lambda": 1.0}], 1)
    assert record.fingerprints == {task: adapter_fingerprint(workdir / "runs" / task / "adapter") for task in TASKS}
    assert len(set(record.fingerprints.values())) == len(TASKS)


@pytest.mark.slow
def test_tune_picks_the_best_candidate_at_large_epsilon_and_records_the_total(workdir, monkeypatch, capsys) -> None:
    monkeypatch.chdir(workdir)
    grid = "lambda=" + ",".join(map(str, LAMBDAS))
    # n_t = the packaged (public) validation split sizes: no subsampling, so u is the task-averaged accuracy
    public = {task: len(data) for task, data in _validation_sets(workdir).items()}
    sizes = ",".join(f"{task}={n}" for task, n in public.items())
    assert main(["tune", "ta.yaml", "tuned", "--grid", grid, "--epsilon", "1e6", "--tasks", ",".join(TASKS),
                 "--validation_size", sizes, "--lora-merge-cache", "cache"]) == 0
    out = capsys.readouterr().out
    record = json.loads((workdir / "tuned" / "dp_selection.json").read_text())
    chosen_lambda = yaml.safe_load((workdir / "tuned" / "mergekit_config.yml").read_text())["parameters"]["lambda"]
    assert record["candidates"][record["chosen"]] == {"lambda": chosen_lambda}
    assert sorted(p.name for p in workdir.iterdir() if "candidates" in p.name) == []  # scratch merges removed

    utilities = {}
    for lam in LAMBDAS:  # the non-private argmax, merged and scored independently
        config = yaml.safe_load((workdir / "ta.yaml").read_text())
        config["parameters"]["lambda"] = lam
        (workdir / f"ta_{lam}.yaml").write_text(yaml.safe_dump(config))
        assert main(["merge", f"ta_{lam}.yaml", f"check_{lam}", "--lora-merge-cache", "cache", "--quiet"]) == 0
        utilities[lam] = _validation_accuracy(workdir, workdir / f"check_{lam}")
    assert len(set(utilities.values())) > 1, utilities  # the grid is informative
    assert utilities[chosen_lambda] == max(utilities.values()), utilities
    assert not any(f"{u:.4f}" in out for u in utilities.values())  # scores are not printed

    assert record["validation_size"] == public and "validation_sizes" not in record
    assert record["sensitivity"] == pytest.approx(1 / (2 * min(public.values())))
    assert record["relation"] == "addition, removal or replacement"
    assert (record["total_epsilon"], record["total_delta"]) == (6.0 + 1e6, 1e-5)  # sequential: max ε_t + ε_sel
    assert record["composition"] == "sequential" and "ε = 1e+06" in out
    assert record["seeded"] is False  # the CLI draws from OS entropy

    assert main(["push", "tuned", "--runs", "runs", "--tasks", ",".join(TASKS), "--dry-run"]) == 0
    card = (workdir / "tuned-hub" / "README.md").read_text()
    assert "chosen on private validation data by the exponential mechanism among 3 candidates" in card
    assert "(ε = 1e+06, δ = 1e-05)-DP" in card
    readme = (workdir / "tuned" / "README.md").read_text()  # its privacy section restated with the total
    assert "(ε = 1e+06, δ = 1e-05)-DP" in readme and "(ε = 6, δ = 1e-05)-DP" not in readme
    assert "per addition, removal or replacement of one validation example" in card
    assert "public validation size n = " + ", ".join(f"{task}: {n}" for task, n in public.items()) in card


@pytest.mark.slow
def test_tune_subsamples_to_the_public_size_and_releases_no_private_size(workdir, monkeypatch, capsys) -> None:
    monkeypatch.chdir(workdir)
    private = {task: len(data) for task, data in _validation_sets(workdir).items()}
    assert min(private.values()) > 40
    scored = []

    def counting(merged, runs, validation, *args):  # the sets every candidate is scored on
        scored.append({task: len(data) for task, data in validation.items()})
        return correct_counts(merged, runs, validation, *args)

    monkeypatch.setattr(tune_script, "correct_counts", counting)
    assert main(["tune", "ta.yaml", "tuned40", "--grid", "lambda=0.0,1.0", "--epsilon", "1", "--tasks",
                 ",".join(TASKS), "--validation_size", "40", "--lora-merge-cache", "cache"]) == 0
    assert scored == [dict.fromkeys(TASKS, 40)] * 2
    out = capsys.readouterr()  # stderr: the operator's progress bars, not part of a release
    text = (workdir / "tuned40" / "dp_selection.json").read_text()
    record = json.loads(text)
    assert record["validation_size"] == dict.fromkeys(TASKS, 40)
    assert record["sensitivity"] == pytest.approx(1 / (2 * 40))
    assert main(["push", "tuned40", "--runs", "runs", "--tasks", ",".join(TASKS), "--dry-run"]) == 0
    card = (workdir / "tuned40-hub" / "README.md").read_text()
    assert "public validation size n = 40 per task" in card
    selection = card[card.index("chosen on private validation data"):]
    selection = selection[:selection.index("\n")]
    for n in private.values():  # the private set sizes are in neither the record, the card nor the report
        assert not re.search(rf"\b{n}\b", text + selection + out.out), n


@pytest.mark.slow
def test_a_seeded_tune_is_recorded_seeded_and_push_refuses_it(workdir, monkeypatch, capsys) -> None:
    """tune_merge's ``seed`` (the API's; the CLI draws from OS entropy) is recorded like a training run's dp_seed."""
    monkeypatch.chdir(workdir)
    record = tune_script.tune_merge(
        yaml.safe_load((workdir / "ta.yaml").read_text()), [GridAxis.parse("lambda=0.0,1.0")],
        task_runs(workdir / "runs", list(TASKS)), "tuned_seeded", epsilon=1.0, mechanism="exponential",
        composition="sequential", base_dir=workdir / "runs" / "base", validation_size=20, lora_merge_cache="cache",
        seed=5, log=lambda line: None)
    assert record.seeded is True and json.loads((workdir / "tuned_seeded" / "dp_selection.json").read_text())["seeded"]
    assert main(["push", "tuned_seeded", "--runs", "runs", "--tasks", ",".join(TASKS), "--dry-run"]) == 2
    assert "selected with a fixed --seed" in capsys.readouterr().err


@pytest.mark.slow
def test_tune_refuses_bad_settings_before_merging(workdir, monkeypatch, capsys) -> None:
    monkeypatch.chdir(workdir)
    common = ["--tasks", ",".join(TASKS), "--lora-merge-cache", "cache"]
    assert main(["tune", "ta.yaml", "bad", "--grid", "lambda=0.3,1", "--epsilon", "0", *common]) == 2
    assert "--epsilon must be positive" in capsys.readouterr().err
    assert main(["tune", "ta.yaml", "bad", "--grid", "lambda=0.3", "--epsilon", "1", *common]) == 2
    assert "fewer than 2 candidate" in capsys.readouterr().err
    for bad in ("0", "bbc_news=100", "lots"):
        assert main(["tune", "ta.yaml", "bad", "--grid", "lambda=0.3,1", "--epsilon", "1", "--validation_size",
                     bad, *common]) == 2
        assert "--validation_size" in capsys.readouterr().err
    (workdir / "occupied").mkdir()
    (workdir / "occupied" / "x").write_text("keep me")
    assert main(["tune", "ta.yaml", "occupied", "--grid", "lambda=0.3,1", "--epsilon", "1", *common]) == 2
    assert (workdir / "occupied" / "x").read_text() == "keep me"
    assert not (workdir / "bad").exists()


@pytest.mark.slow
def test_a_user_level_adapter_gets_a_selection_per_unit(tmp_path, monkeypatch, capsys) -> None:
    """rotten_tomatoes' adapter is per film (unit:movie): at most --rows_per_unit of a film's validation rows are
    scored, Δ = m/(T·n), and the record and card say so; a unit column the validation split lacks is refused."""
    monkeypatch.chdir(tmp_path)
    save_tiny_bert(tmp_path / "runs" / "base")
    _save_adapter(tmp_path / "runs", "bbc_news", 5, 1)
    _save_adapter(tmp_path / "runs", "rotten_tomatoes", 2, 2, privacy_unit="unit:movie", num_units=300)
    _save_adapter(tmp_path / "runs", "bbc_news", 5, 3, folder="bbc_by_author", privacy_unit="unit:author",
                  num_units=100)
    adapters = ["./runs/bbc_news/encoder_adapter", "./runs/rotten_tomatoes/encoder_adapter"]
    Path("ta.yaml").write_text(lora_config_yaml("task_arithmetic", "./runs/base", adapters, "parameters:\n"
                                                "  lambda: 0.3\n  weight: 1.0\n"))
    common = ["--grid", "lambda=0.0,1.0", "--epsilon", "1", "--validation_size", "100", "--rows_per_unit", "2",
              "--lora-merge-cache", "cache"]
    assert main(["tune", "ta.yaml", "bad", "--tasks", "bbc_by_author,rotten_tomatoes", *common]) == 2
    err = capsys.readouterr().err
    assert "bbc_by_author: its adapter's guarantee is per unit:author" in err and "no column 'author'" in err
    assert "--tasks" in err and not Path("bad").exists()

    scored = []

    def counting(merged, runs, validation, *args):
        scored.append({task: len(data) for task, data in validation.items()})
        return correct_counts(merged, runs, validation, *args)

    monkeypatch.setattr(tune_script, "correct_counts", counting)
    assert main(["tune", "ta.yaml", "tuned", "--tasks", "bbc_news,rotten_tomatoes", *common]) == 0
    films = Counter(load_task("rotten_tomatoes")[0]["validation"]["movie"])
    capped = sum(min(2, rows) for rows in films.values())
    assert capped < 100 < len(films) * max(films.values())  # the cap, not n, limits the scored rows
    assert scored == [{"bbc_news": 100, "rotten_tomatoes": capped}] * 2
    record = json.loads(Path("tuned/dp_selection.json").read_text())
    assert record["units"] == {"bbc_news": "example", "rotten_tomatoes": "unit:movie"}
    assert record["rows_per_unit"] == 2 and record["sensitivity"] == pytest.approx(2 / (2 * 100))

    assert main(["push", "tuned", "--runs", "runs", "--tasks", "bbc_news,rotten_tomatoes", "--dry-run"]) == 0
    card = Path("tuned-hub/README.md").read_text()
    assert ("giving ε = 6, δ = 1e-05 per privacy unit (all training rows sharing one value of `movie`; one "
            "training example (row))") in card
    assert ("per addition, removal or replacement of one validation unit (bbc_news: one example; rotten_tomatoes: "
            "all rows sharing one value of `movie`, at most 2 of them scored)") in card
    older = {key: value for key, value in record.items() if key not in ("units", "rows_per_unit")}
    Path("tuned/dp_selection.json").write_text(json.dumps(older))  # a selection made per row, before units
    assert main(["push", "tuned", "--runs", "runs", "--tasks", "bbc_news,rotten_tomatoes", "--dry-run"]) == 2
    assert "made its selection per validation example" in capsys.readouterr().err


def test_tune_refuses_a_mix_of_causal_lm_and_classifier_runs(tmp_path) -> None:
    """One merge is either a causal LM or an encoder with heads: a mixed --tasks is refused before any merge."""
    from types import SimpleNamespace

    from hf_dpmerge.data.tasks import get_task_spec

    runs = [SimpleNamespace(name="rotten_tomatoes", spec=get_task_spec("rotten_tomatoes"), is_causal_lm=True),
            SimpleNamespace(name="bbc_news", spec=get_task_spec("bbc_news"), is_causal_lm=False)]
    with pytest.raises(ValueError, match=r"tune: \['rotten_tomatoes'\] are causal-LM runs .* --tasks of one kind"):
        tune_script.prepare_scoring(runs, tmp_path / "out", epsilon=1.0, composition="sequential",
                                    base_dir=tmp_path, validation_size=10, batch_size=8, device="cpu",
                                    rng=np.random.default_rng(0), seeded=False, command="tune")
    assert not (tmp_path / "out").exists()
