"""hf-dpmerge evolve: CMA-ES over merge weights, one private choice per generation (docs/design.md §13)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from hf_dpmerge.cli.main import main
from hf_dpmerge.scripts.evolve import evolve_search, weighted_config
from tests.workflow.test_tune import TASKS, workdir  # noqa: F401 - the tiny runs and ta.yaml fixture

pytest.importorskip("cma")
SEARCH = dict(dimension=2, start=1.0, population=4, sensitivity=0.01, mechanism="exponential", low=0.0, high=2.0,
              step=0.3)


def _run(score, generations=6, epsilon=1e9, seed=0):
    return evolve_search(score, generations=generations, epsilon=epsilon, rng=np.random.default_rng(seed), **SEARCH)


def test_the_search_learns_only_the_private_choices():
    """Two utilities with the same best candidate in every generation (at ε → ∞ the mechanism is the argmax) give
    the same search: what the non-chosen candidates scored never reaches it."""
    optimum = np.array([1.6, 0.4])

    def exact(index, x):
        return -float(np.sum((np.asarray(x) - optimum) ** 2))

    def distorted(index, x):  # monotone in the same distance: the same argmax, other values
        return float(np.exp(exact(index, x))) * 7.0 - 3.0

    candidates, chosen = _run(exact)
    assert (candidates, chosen) == _run(distorted)
    assert len(candidates) == 6 * 4 and [c // 4 for c in chosen] == list(range(6))
    assert all(exact(0, candidates[c]) == max(exact(0, x) for x in candidates[4 * g:4 * g + 4])
               for g, c in enumerate(chosen))
    start, end = exact(0, [1.0, 1.0]), exact(0, candidates[chosen[-1]])
    assert end > start  # it moved towards the optimum
    assert all(0.0 <= v <= 2.0 for x in candidates for v in x)


def test_at_small_epsilon_the_choice_ignores_the_utility():
    """ε → 0: every candidate is equally likely, whatever its score."""
    picks = [_run(lambda i, x: float(i % 4 == 0), generations=1, epsilon=1e-9, seed=s)[1][0] for s in range(200)]
    counts = np.bincount(picks, minlength=4)
    assert counts.min() > 25, counts


def test_a_scorer_using_numpys_global_random_state_changes_no_proposal():
    """CMA-ES samples from the search's own generator: a scorer that reseeds and draws from np.random (as code in
    the scoring path may) leaves every proposal and choice as they were, and the search leaves np.random alone."""
    def exact(index, x):
        return -float(np.sum((np.asarray(x) - [1.6, 0.4]) ** 2))

    def meddling(index, x):
        np.random.seed(index)
        np.random.standard_normal(5)
        return exact(index, x)

    np.random.seed(7)
    before = np.random.get_state()[1].copy()
    clean = _run(exact)
    assert (np.random.get_state()[1] == before).all() and np.random.get_state()[2] == 624  # untouched
    assert _run(meddling) == clean


def test_weighted_config_sets_each_models_weight_or_gradient():
    config = {"merge_method": "task_arithmetic", "models": [{"model": "a"}, {"model": "b", "parameters": {"x": 1}}]}
    one = weighted_config(config, [0.5, 1.25], 1)
    assert [m["parameters"]["weight"] for m in one["models"]] == [0.5, 1.25]
    assert one["models"][1]["parameters"]["x"] == 1  # other per-model parameters are kept
    two = weighted_config(config, [0.5, 0.7, 1.0, 1.5], 2)
    assert [m["parameters"]["weight"] for m in two["models"]] == [[0.5, 0.7], [1.0, 1.5]]
    assert "parameters" not in config["models"][0]  # the base config is not modified


@pytest.mark.slow
def test_evolve_keeps_the_last_choice_with_its_composed_guarantee(workdir, monkeypatch, capsys):  # noqa: F811
    monkeypatch.chdir(workdir)
    assert main(["evolve", "ta.yaml", "evolved", "--epsilon", "2", "--generations", "2", "--population", "2",
                 "--layer_points", "2", "--tasks", ",".join(TASKS), "--validation_size", "40", "--seed", "3",
                 "--lora-merge-cache", "cache"]) == 0
    out = capsys.readouterr().out
    record = json.loads((workdir / "evolved" / "dp_selection.json").read_text())
    assert record["epsilon"] == 2 and record["extra"]["epsilon_per_generation"] == 1.0
    assert record["chosen"] == record["extra"]["chosen_per_generation"][-1] and len(record["candidates"]) == 4
    assert (record["total_epsilon"], record["total_delta"]) == (6.0 + 2.0, 1e-5)  # sequential: max ε_t + ε_sel
    config = yaml.safe_load((workdir / "evolved" / "mergekit_config.yml").read_text())
    chosen = record["candidates"][record["chosen"]]["weights"]
    weights = [m["parameters"]["weight"] for m in config["models"]]
    assert all(len(w) == 2 for w in weights)  # two weights per model: a gradient over the layers
    assert [v for w in weights for v in w] == pytest.approx(chosen, abs=1e-6)
    assert sorted(p.name for p in Path(workdir).iterdir() if "candidates" in p.name) == []
    assert "ε = 8" in out
    assert record["seeded"] is True  # --seed 3: whoever knows it can redraw the subsamples and the noise
    push = ["push", "evolved", "--runs", "runs", "--tasks", ",".join(TASKS), "--dry-run"]
    assert main(push) == 2
    assert "selected with a fixed --seed" in capsys.readouterr().err and not (workdir / "evolved-hub").exists()
    assert main([*push, "--allow-seeded"]) == 0
    card = (workdir / "evolved-hub" / "README.md").read_text()
    assert "once in each of 2 generations of a CMA-ES search (4 proposals in all" in card
    readme = (workdir / "evolved" / "README.md").read_text()  # the merged model's own privacy section
    assert "**Seeded selection.**" in card and "**Seeded selection.**" in readme


@pytest.mark.slow
def test_an_unseeded_evolve_is_recorded_unseeded_and_pushes(workdir, monkeypatch):  # noqa: F811
    monkeypatch.chdir(workdir)
    assert main(["evolve", "ta.yaml", "evolved_fresh", "--epsilon", "1", "--generations", "1", "--population", "2",
                 "--tasks", ",".join(TASKS), "--validation_size", "20", "--lora-merge-cache", "cache"]) == 0
    assert json.loads((workdir / "evolved_fresh" / "dp_selection.json").read_text())["seeded"] is False
    assert main(["push", "evolved_fresh", "--runs", "runs", "--tasks", ",".join(TASKS), "--dry-run"]) == 0
    assert "Seeded" not in (workdir / "evolved_fresh-hub" / "README.md").read_text()


@pytest.mark.parametrize("flags, message", [
    (["--generations", "0"], "--generations must be ≥ 1"),
    (["--population", "1"], "--population ≥ 2"),
    (["--low", "1.5"], "must bracket the start weight 1"),
    (["--step", "0"], "--step must be positive"),
], ids=["generations", "population", "bounds", "step"])
def test_bad_evolve_settings_are_refused_before_merging(workdir, monkeypatch, capsys, flags, message):  # noqa: F811
    monkeypatch.chdir(workdir)
    assert main(["evolve", "ta.yaml", "bad", "--epsilon", "1", "--tasks", ",".join(TASKS), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not (workdir / "bad").exists()
