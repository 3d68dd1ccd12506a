"""python -m benchmarks.quality --grid stress-smoke: the stress machinery runs end to end (training, floor, noise
arm, tuned merges, per-example scores), writes its report, and a rerun skips every unit; --plan times the headline."""

import json
import re

import pytest
from safetensors.torch import load_file

from benchmarks.quality.__main__ import _with_train_flags
from benchmarks.quality.__main__ import main as quality_benchmark
from benchmarks.quality.grid import GRIDS, Cell, plan_cells
from benchmarks.quality.merge_space import BUDGET, LAMBDAS, SCALE, SPACES, grid_edges, merge_configuration
from benchmarks.quality.store import Store
from benchmarks.quality.stress_run import stress_settings
from benchmarks.quality.units import Context, parse_train_arguments, train_arguments
from tests.utils.subprocess_helpers import REPO, run_quality_benchmark
from tests.utils.tiny_models import save_tiny_bert


def test_stress_grid_has_the_six_tasks_floor_and_noise_arm():
    grid = GRIDS["stress"]
    assert {"reuters_r8", "reuters_r52", "20newsgroups", "rotten_tomatoes", "election_tweets", "bbc_news"} <= set(
        grid.tasks)
    assert {"task_arithmetic", "ties", "dare_ties", "della", "breadcrumbs_ties", "cauchy_poe", "dp_aware"} <= set(
        grid.merges)
    cells = plan_cells(grid, grid.seeds)
    names = [c.name for c in cells]
    for seed in range(3):  # ≥ 3 seeds for the headline cells
        for name in ("non_private", "dp_sgd-eps4", "dp_merging-eps4"):
            assert f"{name}-seed{seed}" in names
    assert {"head_only-seed0", "head_only-eps4-seed0", "head_only-eps1-seed0"} <= set(names)  # the floors
    assert {"two_query-eps1-seed0", "dp_sgd-eps8-seed0", "noise0.01-seed0"} <= set(names)
    last_headline = names.index("dp_merging-eps4-seed2")
    assert all(not n.startswith(("two_query", "noise")) for n in names[:last_headline])  # headline cells run first


def test_the_non_private_floor_trains_without_dp_and_each_private_floor_at_its_epsilon(tmp_path):
    """The floor without ε is the non-private head (DP_RECIPE alone would make it an ε = 8 DP release)."""
    ctx = Context(GRIDS["stress"], tmp_path, Store(tmp_path), None, False, print)
    parsed = {epsilon: parse_train_arguments(train_arguments(ctx, Cell("head_only", epsilon, 0)))
              for epsilon in (None, 4.0, 8.0)}
    configs = {epsilon: config for epsilon, (_, config) in parsed.items()}
    assert configs[None].dp is False
    assert (configs[4.0].dp, configs[4.0].target_epsilon) == (True, 4.0)
    assert (configs[8.0].dp, configs[8.0].target_epsilon) == (True, 8.0)
    assert all(not script.train_lora for script, _ in parsed.values())


def test_cells_keep_the_one_phase_lora_recipe_they_were_defined_on(tmp_path):
    """The LP-FT default of train_glue.py (a head phase, LoRA on the top 2 layers, no SAM or alignment) does not
    reach the benchmark's cells: DP-Merging keeps DP-SAT and DPSAMConfig's λ, DP-SGD neither, both one phase."""
    from hf_dpmerge.scripts.train import head_phase_epsilon

    ctx = Context(GRIDS["cpu"], tmp_path, Store(tmp_path), None, False, print)
    parsed = {t: parse_train_arguments(train_arguments(ctx, Cell(t, 8.0, 0))) for t in ("dp_sgd", "dp_merging")}
    for script, config in parsed.values():
        assert head_phase_epsilon(script, config) is None and script.lora_layers == "top_half"
        assert (config.max_steps, config.head_warmup_steps, script.lora_freeze_a) == (30, 0.25, True)
    assert (parsed["dp_merging"][1].sam_mode, parsed["dp_merging"][1].align_lambda) == ("dp_sat", 0.05)
    assert (parsed["dp_sgd"][1].sam_mode, parsed["dp_sgd"][1].align_lambda) == ("none", 0.0)


def test_train_flags_change_the_recipe_and_the_stored_settings_and_refuse_cell_flags(tmp_path):
    """--train-flags: appended after the grid's flags (they win), every unit's settings change (so it reruns);
    flags the benchmark sets per cell, unknown flags and bad values are refused."""
    stress = GRIDS["stress"]
    longer = _with_train_flags(stress, "--max_steps 400 --learning_rate 5e-4")
    cell = Cell("dp_sgd", 4.0, 1)
    contexts = [Context(grid, tmp_path, Store(tmp_path), None, False, print) for grid in (stress, longer)]
    _, config = parse_train_arguments(train_arguments(contexts[1], cell))
    assert (config.max_steps, config.learning_rate, config.target_epsilon, config.seed) == (400, 5e-4, 4.0, 1)
    assert parse_train_arguments(train_arguments(contexts[0], cell))[1].max_steps == 60
    assert "--train-flags --max_steps 400 --learning_rate 5e-4" in longer.reductions
    for unit in ("train_bbc_news", "tune_ties"):
        assert stress_settings(contexts[0], cell, unit) != stress_settings(contexts[1], cell, unit)
    for flags, message in (("--seed 3", "--seed is set per cell"), ("--sam_mode=dp_sat", "--sam_mode is set"),
                           ("--dp-seed 3", "--dp_seed is set"), ("--target_eps 1", "not used by"),  # no abbreviations
                           ("--dp false", "--dp is set per cell"), ("--bogus 1", "not used by the HfArgumentParser"),
                           ("--max_steps abc", "refuses a value")):
        with pytest.raises(SystemExit, match=message):
            _with_train_flags(stress, flags)


def test_methods_on_one_scale_search_the_same_lambda_grid_and_edges_are_found():
    """The earlier spaces gave task_arithmetic λ ∈ {0.25, 0.5, 0.75, 1} and dp_aware (same sum scale) {0.5, 1}."""
    for scale in ("sum", "mean"):
        grids = {method: [p["lambda"] for p in SPACES[method]] for method, s in SCALE.items() if s == scale}
        assert len(grids) >= 2 and all(grid == list(LAMBDAS[scale]) for grid in grids.values()), grids
    assert {"task_arithmetic", "dp_aware", "cauchy_poe"} <= {m for m, s in SCALE.items() if s == "sum"}
    assert all("lambda" not in points[0] or method in SCALE for method, points in SPACES.items())
    assert grid_edges("dp_aware", {"lambda": 0.25}) == ["lambda"] and grid_edges("ties", {"lambda": 2.0}) == ["lambda"]
    assert grid_edges("dp_aware", {"lambda": 0.5}) == [] and grid_edges("sce", {"select_topk": 0.3}) == []


def test_every_method_gets_the_same_budget_and_non_private_inputs_are_declared(tmp_path):
    assert all(len(points) == BUDGET for points in SPACES.values())
    config = merge_configuration("dp_aware", SPACES["dp_aware"][0], tmp_path, [tmp_path / "a", tmp_path / "b"],
                                 non_private=True)
    assert config["parameters"]["allow_non_private"] is True and config["merge_method"] == "dp_aware"
    ties = merge_configuration("ties", SPACES["ties"][1], tmp_path, [tmp_path / "a"], non_private=True)
    assert ties["parameters"] == {"lambda": 1.0} and ties["models"][0]["parameters"] == {"density": 0.5, "weight": 1.0}
    cauchy = merge_configuration("cauchy_poe", SPACES["cauchy_poe"][0], tmp_path, [tmp_path / "a"], non_private=True)
    assert cauchy["parameters"] == {"tol": 0.1, "dp_calibrated": True, "lambda": 0.25}
    with pytest.raises(ValueError, match="no search space"):
        merge_configuration("slerp", {}, tmp_path, [], non_private=True)


@pytest.mark.slow
def test_stress_smoke_grid_runs_reports_then_resumes(tmp_path, capsys):
    base = save_tiny_bert(tmp_path / "tiny-base")
    work = tmp_path / "work"
    command = ["--grid", "stress-smoke", "--work-dir", str(work),
               "--model_name_or_path", str(base), "--seeds", "1", "--merges", "ties,dp_aware", "--seed-test-subsets"]
    first = run_quality_benchmark(*command, cwd=tmp_path, timeout=1800)
    # cells: non_private, dp_sgd ε4, dp_merging ε4, head_only (∞, ε4), noise σ=0.01 — 2 tasks each
    # 10 trainings + 2 noisy adapters + 6 individual scorings + 4 merged cells × 2 tuned methods
    assert "ran 26 units, skipped 0" in first.stdout
    results = work / "results"
    tuned = json.loads((results / "dp_merging-eps4-seed0" / "tune_ties.json").read_text())
    assert len(tuned["trials"]) == BUDGET and tuned["point"] == tuned["trials"][tuned["selected"]]["point"]
    individual = json.loads((results / "dp_merging-eps4-seed0" / "individual.json").read_text())
    assert {len(v) for v in tuned["correct"].values()} == {48}
    assert {len(v) for v in individual["correct"]["test"].values()} == {48}
    # each seed's own test subset: its indices are stored (48 distinct per task) and part of the unit's settings
    assert {len(set(v)) for v in individual["examples"]["test"].values()} == {48}
    assert individual["settings"]["test_subset_seed"] == 0 and tuned["settings"]["test_subset_seed"] == 0
    assert {len(v) for v in individual["correct"]["validation"].values()} == {32}
    noise = json.loads((results / "noise0.01-seed0" / "tune_dp_aware.json").read_text())
    assert noise["settings"]["noise_std"] == 0.01
    record = json.loads((work / "cells" / "noise0.01-seed0" / "runs" / "bbc_news" / "adapter" /
                         "dp_privacy.json").read_text())
    assert record["extra"]["injected_noise_std"] == 0.01 and record["dp"] is False
    floor = json.loads((results / "head_only-eps4-seed0" / "train_bbc_news.json").read_text())
    assert 0 < floor["summary"]["epsilon"] <= 4.0  # the floor's head is an accounted DP release
    assert not (results / "head_only-eps4-seed0" / "tune_ties.json").exists()  # the floor is not merged
    floor_lora = load_file(work / "cells" / "head_only-eps4-seed0" / "runs" / "bbc_news" / "encoder_adapter" /
                           "adapter_model.safetensors")
    assert all(not v.any() for k, v in floor_lora.items() if ".lora_B." in k)  # LoRA frozen at B = 0: base encoder
    assert not list((work / "cells").rglob("merged/ties-*"))  # every merge was scored, then removed
    stored = sorted(results.rglob("*.json"))
    before = {path: path.stat().st_mtime_ns for path in stored}

    capsys.readouterr()
    assert quality_benchmark(command) == 0  # the rerun, in this process: it only reads and reports
    assert "ran 0 units, skipped 26" in capsys.readouterr().out
    assert {path: path.stat().st_mtime_ns for path in stored} == before
    report = (work / "BENCHMARKS_STRESS.md").read_text()
    for section in ("## Targets", "## Merged accuracy", "## Gain retained", "## Selected hyper-parameters",
                    "## Significance of the headline comparisons", "## Which method when"):
        assert section in report
    assert re.search(r"ties, ε = 4: DP-Merging vs DP-SGD: [+-]\d+\.\d points \(95 % cluster-bootstrap CI .*"
                     r"exact McNemar p = .*1 seed, 96 distinct test examples", report)
    assert "Each seed was scored on its own seeded stratified test subset" in report
    assert "| noise σ=0.01 |" in report


@pytest.mark.slow
def test_plan_states_headline_and_rest_times(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert quality_benchmark(["--grid", "stress", "--plan"]) == 0  # in this process (the smoke test runs python -m)
    stdout = capsys.readouterr().out
    headline = re.search(r"headline cells:.*?total\s+([\d.]+) min", stdout, re.S)
    rest = re.search(r"rest cells:.*?total\s+([\d.]+) min", stdout, re.S)
    assert headline and rest
    assert float(headline.group(1)) <= 120  # the budget for the headline cells on 2 cores
    assert "reductions:" in stdout
