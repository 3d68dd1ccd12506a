"""The merge of private LP-FT adapters: DP-SGD against DP-Merging per seed, gain over the private heads, the
``--as-adapter`` check, the kept adapters found through the lpft study's stored units, one report per recipe and ε."""

import argparse
import dataclasses
import json

import pytest
from scipy import stats

from benchmarks import harness
from benchmarks.merging import METHODS, TRAINERS, packaged_parameters
from benchmarks.significance import holm
from benchmarks.studies import lpft, lpft_merge
from benchmarks.studies.lpft_merge import DEFAULT_RECIPE, LpftMerge
from hf_dpmerge.scripts import train as train_script

TWO_TASKS = ("rotten_tomatoes", "election_tweets")
REPORT = f"{DEFAULT_RECIPE}/LPFT_MERGE.md"


def lpft_unit(task, candidate, seed, test=0.8, epsilon=8.0):
    """A stored unit of the lpft study (its name is the folder that keeps its adapter)."""
    return {"name": lpft.lpft_unit("minilm", task, candidate, seed, epsilon).name,
            "settings": {"base": "minilm", "task": task, "candidate": candidate, "seed": seed,
                         "target_epsilon": epsilon}, "result": {"test": {"accuracy": test}}}


def merge_unit(trainer, seed, method, individual, merged, tasks=TWO_TASKS, epsilon=8.0, recipe=DEFAULT_RECIPE):
    return {"name": f"{trainer}-seed{seed}-{method}",
            "settings": {"recipe": recipe, "target_epsilon": epsilon, "trainer": trainer, "seed": seed,
                         "candidate": lpft_merge.trainer_candidates(recipe)[trainer], "method": method,
                         "tasks": list(tasks)},
            "result": {"evaluation": {"tasks": {t: {"individual": individual[i], "merged": merged[i]}
                                                for i, t in enumerate(tasks)}}}}


def with_lpft_units(monkeypatch, units):
    monkeypatch.setattr(harness, "stored", lambda study, schema: units if study == "lpft" else [])


def plan(argv, kept):
    parser = argparse.ArgumentParser()
    LpftMerge().add_arguments(parser)
    return LpftMerge().plan(parser.parse_args([*argv, "--kept", str(kept)]))


def keep(kept, unit):
    (kept / unit["name"] / unit["settings"]["task"] / "encoder_adapter").mkdir(parents=True)
    return unit


def test_the_merge_report_compares_trainers_per_seed_with_holm_and_gain_over_the_private_head(monkeypatch):
    """DP-Merging − DP-SGD in task-averaged merged accuracy, paired over seeds, Holm over methods; gain retained is
    (merged − head) / (individual − head) on the averaged scores, the head being the same seed's private head."""
    merged = {("dp_sgd", 1): (0.80, 0.88), ("dp_sgd", 2): (0.79, 0.87), ("dp_sgd", 3): (0.81, 0.88),
              ("dp_merging", 1): (0.81, 0.89), ("dp_merging", 2): (0.81, 0.88), ("dp_merging", 3): (0.82, 0.90)}
    units = [merge_unit(tr, s, m, (0.82, 0.90), merged[(tr, s)]) for (tr, s) in merged for m in METHODS]
    with_lpft_units(monkeypatch, [lpft_unit(t, lpft.HEAD, s, h) for s in (1, 2, 3)
                                  for t, h in zip(TWO_TASKS, (0.78, 0.88))] + [
        lpft_unit(t, lpft.HEAD, s, 0.5, 4.0) for s in (1, 2, 3) for t in TWO_TASKS])  # ε = 4's heads: not these
    text = LpftMerge().report(units)[REPORT]
    score = {k: 100 * sum(v) / 2 for k, v in merged.items()}
    p = stats.ttest_rel([score[("dp_merging", s)] for s in (1, 2, 3)], [score[("dp_sgd", s)] for s in (1, 2, 3)])
    adjusted = holm([p.pvalue] * len(METHODS))
    row = next(line for line in text.splitlines() if line.startswith("| ties | 1,2,3 |"))
    assert "+1.00 +1.50 +1.50 | +1.33" in row and f"{p.pvalue:.3g}" in row and f"{adjusted[0]:.3g}" in row
    sgd = next(line for line in text.splitlines() if line.startswith("| ties | dp_sgd |"))
    individual, head = 86.0, 83.0
    merged_sgd = sum(score[("dp_sgd", s)] for s in (1, 2, 3)) / 3
    assert f"| {head:.1f} | {individual:.1f} | {merged_sgd:.1f} |" in sgd
    assert f"{100 * (merged_sgd - head) / (individual - head):.0f} %" in sgd


def test_the_export_gives_recommend_the_comparison_of_the_default_recipe_at_each_epsilon(monkeypatch):
    """Hand-worked: heads 78/88 (83), individual 82/90 (86) for both trainers; DP-Merging − DP-SGD merged is
    +1.00, +1.50, +1.50 on seeds 1–3 for every method, so each mean is +1.33 with the same paired p, Holm over
    four; the earlier recipe's units are left out."""
    merged = {("dp_sgd", 1): (0.80, 0.88), ("dp_sgd", 2): (0.79, 0.87), ("dp_sgd", 3): (0.81, 0.88),
              ("dp_merging", 1): (0.81, 0.89), ("dp_merging", 2): (0.81, 0.88), ("dp_merging", 3): (0.82, 0.90)}
    units = [merge_unit(tr, s, m, (0.82, 0.90), merged[(tr, s)]) for (tr, s) in merged for m in METHODS]
    units += [merge_unit("dp_sgd", 1, "ties", (0.5, 0.5), (0.5, 0.5), recipe="k2_b1024_t75_lr3e-3_head6_dpsgd")]
    with_lpft_units(monkeypatch, [lpft_unit(t, lpft.HEAD, s, h) for s in (1, 2, 3)
                                  for t, h in zip(TWO_TASKS, (0.78, 0.88))])
    exported = json.loads(LpftMerge().exports(units)[lpft_merge.EVIDENCE])
    (comparison,) = exported["comparisons"]
    score = {k: 100 * sum(v) / 2 for k, v in merged.items()}
    p = stats.ttest_rel([score[("dp_merging", s)] for s in (1, 2, 3)], [score[("dp_sgd", s)] for s in (1, 2, 3)])
    assert comparison["seeds"] == [1, 2, 3] and comparison["tasks"] == list(TWO_TASKS)
    assert comparison["individual"] == {"dp_sgd": 86.0, "dp_merging": 86.0} and comparison["floor"] == 83.0
    assert comparison["methods"]["ties"] == {"difference": 1.33, "p": pytest.approx(p.pvalue),
                                             "holm": pytest.approx(holm([p.pvalue] * len(METHODS))[0])}
    assert comparison["report"] == f"benchmarks/reports/lpft_merge/{REPORT}"


def test_recommend_reads_the_export_of_the_stored_units():
    """What ``hf-dpmerge recommend``'s trainer advice reads is this study's export of the committed units."""
    study = LpftMerge()
    for path, text in study.exports(harness.stored(study.name, study.schema)).items():
        assert (harness.REPO / path).read_text() == text, path


def test_the_merge_report_states_the_largest_as_adapter_deviation_per_method_and_trainer(monkeypatch):
    """Units of a factor-space method carry their --as-adapter check; the report takes the worst over units."""
    with_lpft_units(monkeypatch, [])
    units = [merge_unit(tr, s, m, (0.82, 0.90), (0.81, 0.89)) for tr in TRAINERS for s in (1, 2) for m in METHODS]
    for u in units:
        if u["settings"]["method"] in lpft_merge.AS_ADAPTER_METHODS:
            seed = u["settings"]["seed"]
            u["result"]["as_adapter"] = {"max_abs_difference": 1e-7 * seed, "max_abs_task_vector": 0.01 * seed,
                                         "adapter_bytes": 100, "dense_bytes": 1000 * seed}
    text = LpftMerge().report(units)[REPORT]
    for method in lpft_merge.AS_ADAPTER_METHODS:
        for trainer in TRAINERS:
            assert f"| {method} | {trainer} | 2 | 2.0e-07 | 2.0e-02 | 20× |" in text
    assert "| ties | dp_sgd | 2 |" not in text.split("## `--as-adapter`")[1]
    ties = LpftMerge().report([u for u in units if u["settings"]["method"] == "ties"])[REPORT]
    assert "## `--as-adapter`" not in ties


def test_a_seed_merges_only_when_both_trainers_kept_every_task(tmp_path, monkeypatch):
    twin = lpft_merge.TWIN[DEFAULT_RECIPE]
    units = [keep(tmp_path, lpft_unit(t, c, 1)) for t in lpft_merge.TASKS for c in (DEFAULT_RECIPE, twin)]
    units.append(keep(tmp_path, lpft_unit("rotten_tomatoes", DEFAULT_RECIPE, 2)))
    units += [lpft_unit(t, c, 3) for t in lpft_merge.TASKS for c in (DEFAULT_RECIPE, twin)]  # stored, not kept here
    units += [keep(tmp_path, lpft_unit(t, c, 4, epsilon=4.0)) for t in lpft_merge.TASKS for c in (DEFAULT_RECIPE, twin)]
    with_lpft_units(monkeypatch, units)
    planned = plan(["--methods", "ties"], tmp_path)
    assert [u.name for u in planned] == [f"{DEFAULT_RECIPE}-{tr}-seed1-ties" for tr in TRAINERS]
    assert [u.settings["candidate"] for u in planned] == [DEFAULT_RECIPE, twin]
    assert planned[0].settings["merge_parameters"] == packaged_parameters("ties")  # merge_configs/ties.yaml's
    with pytest.raises(ValueError, match="no seed has both trainers' adapters"):  # another recipe: none kept
        plan(["--recipe", "k2_b1024_t75_lr3e-3_head6_dpsgd"], tmp_path)
    at_four = plan(["--epsilon", "4", "--methods", "ties"], tmp_path)  # ε = 4's own seeds, units and report
    assert [u.name for u in at_four] == [f"{DEFAULT_RECIPE}-eps4-{tr}-seed4-ties" for tr in TRAINERS]
    assert {u.settings["target_epsilon"] for u in at_four} == {4.0}


def test_each_epsilon_has_its_report_and_reads_its_own_heads(monkeypatch):
    with_lpft_units(monkeypatch, [lpft_unit("rotten_tomatoes", lpft.HEAD, 1, 0.77),
                                  lpft_unit("rotten_tomatoes", lpft.HEAD, 1, 0.70, 4.0)])
    units = [merge_unit(tr, 1, "ties", (0.8,), (0.79,), ("rotten_tomatoes",), epsilon=e) for tr in TRAINERS
             for e in (8.0, 4.0)]
    reports = LpftMerge().report(units)
    assert sorted(reports) == [f"{DEFAULT_RECIPE}-eps4/LPFT_MERGE.md", REPORT]
    four = reports[f"{DEFAULT_RECIPE}-eps4/LPFT_MERGE.md"]
    assert "(ε = 4)" in four and "from 2 stored units" in four and "| ties | dp_sgd | 1 | 70.0 | 80.0 | 79.0 |" in four
    assert "| ties | dp_sgd | 1 | 77.0 | 80.0 | 79.0 |" in reports[REPORT]


@pytest.mark.parametrize("recipe", list(lpft_merge.TWIN))
def test_each_recipes_dp_merging_twin_differs_from_it_in_the_phase_2_step_alone(recipe):
    """The DP-Merging trainer is the same LP-FT recipe with DP-SAT (ρ 0.05) and alignment (λ 0.05) in phase 2."""
    sgd, dpm = (train_script.parse_arguments([*lpft.flags("minilm", c, lpft.EPSILON), "--task", "rotten_tomatoes"])
                for c in lpft_merge.trainer_candidates(recipe).values())
    assert (sgd[1].sam_mode, sgd[1].align_lambda) == ("none", 0.0)
    assert (dpm[1].sam_mode, dpm[1].sam_rho, dpm[1].align_lambda) == ("dp_sat", 0.05, 0.05)
    for ours, theirs in zip(sgd, dpm):
        differing = {f.name for f in dataclasses.fields(ours) if getattr(ours, f.name) != getattr(theirs, f.name)}
        assert differing <= {"sam_mode", "sam_rho", "align_lambda"}


@pytest.mark.slow
def test_the_merge_study_merges_and_scores_kept_adapters_end_to_end(tmp_path, monkeypatch):
    """Two tiny LP-FT adapters (the default recipe, shortened) kept as both trainers' units of one seed: dp_aware
    merges them (and checks its ``--as-adapter`` twin) and scores them on the whole test splits, and identical
    adapters under both trainer names give identical scores (the comparison measures the adapters and nothing
    else). The report's other methods and sections: the fabricated-unit tests above."""
    import shutil

    from tests.utils.tiny_models import save_tiny_bert

    base_model = save_tiny_bert(tmp_path / "tiny")
    tasks = list(TWO_TASKS)
    train_script.main(["--model_name_or_path", str(base_model), "--runs_dir", str(tmp_path / "runs"), "--tasks",
                       ",".join(tasks), "--max_train_samples", "64", "--per_device_train_batch_size", "16",
                       "--physical_batch_size", "16", "--max_steps", "2", "--head_phase_steps", "2",
                       "--head_phase_batch_size", "16", "--max_length", "16", "--lora_layers", "top_1",
                       "--max_eval_samples", "32"])  # training's own eval; the study scores whole test splits
    kept = [lpft_unit(t, c, 0) for c in lpft_merge.trainer_candidates(DEFAULT_RECIPE).values() for t in tasks]
    for unit in kept:
        task = unit["settings"]["task"]
        shutil.copytree(tmp_path / "runs" / task, tmp_path / "kept" / unit["name"] / task,
                        ignore=shutil.ignore_patterns("checkpoints*"))
    with_lpft_units(monkeypatch, kept)
    harness.main(LpftMerge(), ["--kept", str(tmp_path / "kept"), "--base", str(tmp_path / "runs" / "base"),
                               "--work-dir", str(tmp_path / "work"), "--units-dir", str(tmp_path / "units"), "--out",
                               str(tmp_path), "--methods", "dp_aware", "--tasks", ",".join(tasks)],
                 log=lambda _: None)
    units = {u["name"]: u["result"] for u in harness.Store(tmp_path / "units", LpftMerge.schema).results()}
    assert len(units) == len(TRAINERS)
    assert not any(str(tmp_path) in p.read_text() for p in (tmp_path / "units").glob("*.json"))  # no local path
    sgd, dpm = (units[f"{DEFAULT_RECIPE}-{t}-seed0-dp_aware"]["evaluation"]["tasks"] for t in TRAINERS)
    assert sgd == dpm
    assert all(sgd[t]["num_examples"] > 500 for t in tasks)  # whole test splits
    report = (tmp_path / "benchmarks" / "reports" / "lpft_merge" / REPORT).read_text()
    assert "| dp_aware | 0 | +0.00 | +0.00 | — | — |" in report
    for trainer in TRAINERS:  # --as-adapter: dp_aware's adapter is its dense merge
        check = units[f"{DEFAULT_RECIPE}-{trainer}-seed0-dp_aware"]["as_adapter"]
        assert check["max_abs_difference"] < 1e-5 < 1e-3 < check["max_abs_task_vector"]
        assert check["dense_bytes"] > check["adapter_bytes"] > 0
        assert f"| dp_aware | {trainer} | 1 |" in report
