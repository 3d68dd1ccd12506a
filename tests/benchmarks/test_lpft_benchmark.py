"""The merge of private LP-FT adapters: DP-SGD against DP-Merging per seed, gain over the private heads, the
``--as-adapter`` check, kept adapters found per ε."""

import dataclasses
import json

import pytest
from scipy import stats

from benchmarks import harness, lpft_merge
from benchmarks.merge_comparison import METHODS, TRAINERS
from benchmarks.quality.significance import holm
from benchmarks.studies import lpft
from hf_dpmerge.scripts import train as train_script


def unit(task, candidate, seed, validation, test, epsilon=lpft.EPSILON):
    return {"task": task, "candidate": candidate, "seed": seed, "target_epsilon": epsilon,
            "validation": {"accuracy": validation}, "test": {"accuracy": test}, "train_seconds": 60.0}


TWO_TASKS = ("rotten_tomatoes", "election_tweets")


def merge_unit(trainer, seed, method, individual, merged, tasks=TWO_TASKS):
    return {"trainer": trainer, "seed": seed, "method": method, "tasks": tasks,
            "evaluation": {"tasks": {t: {"individual": individual[i], "merged": merged[i]}
                                     for i, t in enumerate(tasks)}}}


def test_the_merge_report_compares_trainers_per_seed_with_holm_and_gain_over_the_private_head(tmp_path):
    """DP-Merging − DP-SGD in task-averaged merged accuracy, paired over seeds, Holm over methods; gain retained is
    (merged − head) / (individual − head) on the averaged scores, the head being the same seed's private head."""
    merged = {("dp_sgd", 1): (0.80, 0.88), ("dp_sgd", 2): (0.79, 0.87), ("dp_sgd", 3): (0.81, 0.88),
              ("dp_merging", 1): (0.81, 0.89), ("dp_merging", 2): (0.81, 0.88), ("dp_merging", 3): (0.82, 0.90)}
    units = [merge_unit(tr, s, m, (0.82, 0.90), merged[(tr, s)]) for (tr, s) in merged for m in METHODS]
    heads = {(t, s): h for s in (1, 2, 3) for t, h in zip(TWO_TASKS, (78.0, 88.0))}
    text = lpft_merge.write_report(units, heads, tmp_path / "LPFT_MERGE.md")
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


def test_the_merge_report_states_the_largest_as_adapter_deviation_per_method_and_trainer(tmp_path):
    """Units of a factor-space method carry their --as-adapter check; the report takes the worst over units."""
    units = [merge_unit(tr, s, m, (0.82, 0.90), (0.81, 0.89)) for tr in TRAINERS for s in (1, 2) for m in METHODS]
    for u in units:
        if u["method"] in lpft_merge.AS_ADAPTER_METHODS:
            u["as_adapter"] = {"max_abs_difference": 1e-7 * u["seed"], "max_abs_task_vector": 0.01 * u["seed"],
                               "adapter_bytes": 100, "dense_bytes": 1000 * u["seed"]}
    text = lpft_merge.write_report(units, {}, tmp_path / "LPFT_MERGE.md")
    for method in lpft_merge.AS_ADAPTER_METHODS:
        for trainer in TRAINERS:
            assert f"| {method} | {trainer} | 2 | 2.0e-07 | 2.0e-02 | 20× |" in text
    assert "| ties | dp_sgd | 2 |" not in text.split("## `--as-adapter`")[1]
    assert "## `--as-adapter`" not in lpft_merge.write_report([u for u in units if u["method"] == "ties"], {},
                                                              tmp_path / "ties.md")


def test_a_seed_merges_only_when_both_trainers_kept_every_task(tmp_path):
    for trainer in TRAINERS:
        for task in lpft_merge.TASKS:
            (lpft_merge.kept_adapter(tmp_path, task, trainer, 1) / "encoder_adapter").mkdir(parents=True)
    (lpft_merge.kept_adapter(tmp_path, "rotten_tomatoes", "dp_sgd", 2) / "encoder_adapter").mkdir(parents=True)
    for task in lpft_merge.TASKS:  # a kept unit at ε = 4 is no seed of the ε = 8 comparison
        (tmp_path / f"{lpft_merge.lpft_unit_name(task, lpft.DEFAULT_CANDIDATE, 3, 4.0)}" / task).mkdir(parents=True)
    assert lpft_merge.complete_seeds(tmp_path, list(lpft_merge.TASKS)) == [1]
    earlier = "k2_b1024_t75_lr3e-3_head6_dpsgd"  # another recipe's adapters: none kept
    assert lpft_merge.complete_seeds(tmp_path, list(lpft_merge.TASKS), earlier) == []


def test_the_merge_at_another_epsilon_reads_that_epsilons_adapters_and_heads_into_its_own_folder(tmp_path,
                                                                                                    monkeypatch):
    """``--epsilon 4`` merges the adapters the LP-FT report stage kept with ``--epsilon 4`` (``…-seedN-eps4``), reads
    the private heads at ε = 4 and writes units and report beside the ε = 8 ones, never into them."""
    for task in TWO_TASKS:
        for trainer in TRAINERS:
            (lpft_merge.kept_adapter(tmp_path, task, trainer, 1, epsilon=4.0) / "encoder_adapter").mkdir(parents=True)
        (lpft_merge.kept_adapter(tmp_path, task, "dp_sgd", 2) / "encoder_adapter").mkdir(parents=True)  # ε = 8 only
    assert lpft_merge.kept_adapter(tmp_path, "rotten_tomatoes", "dp_sgd", 1, epsilon=4.0).parent.name.endswith(
        "-seed1-eps4")
    assert lpft_merge.complete_seeds(tmp_path, list(TWO_TASKS), epsilon=4.0) == [1]
    assert lpft_merge.complete_seeds(tmp_path, list(TWO_TASKS)) == []
    assert lpft_merge.report_dir() == lpft_merge.REPORT_DIR / lpft.DEFAULT_CANDIDATE
    assert lpft_merge.report_dir(epsilon=4.0) == lpft_merge.REPORT_DIR / f"{lpft.DEFAULT_CANDIDATE}-eps4"
    heads = [unit("rotten_tomatoes", lpft.HEAD, 1, 0.8, 0.77), unit("rotten_tomatoes", lpft.HEAD, 1, 0.8, 0.70, 4.0)]
    assert lpft_merge.private_heads(heads, 4.0) == {("rotten_tomatoes", 1): pytest.approx(70.0)}
    merged = []

    def fake_unit(kept, base, tasks, trainer, seed, method, work_dir, path, recipe, epsilon):
        merged.append((trainer, seed, method, epsilon))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(merge_unit(trainer, seed, method, (0.8, 0.9), (0.79, 0.88)) | {
            "target_epsilon": epsilon}))

    monkeypatch.setattr(lpft_merge, "run_unit", fake_unit)
    monkeypatch.setattr(lpft_merge, "REPORT_DIR", tmp_path / "reports")
    monkeypatch.setattr(harness, "stored", lambda study, schema: [
        {"settings": {"base": "minilm", **{k: u[k] for k in ("task", "candidate", "seed", "target_epsilon")}},
         "result": {"test": u["test"]}} for u in heads])
    lpft_merge.main(["--kept", str(tmp_path), "--tasks", ",".join(TWO_TASKS), "--methods", "ties", "--epsilon", "4",
                     "--work-dir", str(tmp_path / "work")])
    assert merged == [(trainer, 1, "ties", 4.0) for trainer in TRAINERS]
    folder = tmp_path / "reports" / f"{lpft.DEFAULT_CANDIDATE}-eps4"
    report = (folder / "LPFT_MERGE.md").read_text()
    assert "(ε = 4)" in report and "--epsilon 4` from 2 stored units" in report
    assert len(list((folder / "units").glob("*.json"))) == 2 and not (tmp_path / "reports" / lpft.DEFAULT_CANDIDATE
                                                                      ).exists()
    with pytest.raises(ValueError, match="merge units at ε"):  # an ε = 4 unit is never averaged into ε = 8's report
        lpft_merge.write_report([merge_unit("dp_sgd", 1, "ties", (0.8, 0.9), (0.8, 0.9)) | {"target_epsilon": 4.0}],
                                {}, tmp_path / "mixed.md")


@pytest.mark.parametrize("recipe", list(lpft_merge.TWIN))
def test_each_recipes_dp_merging_twin_differs_from_it_in_the_phase_2_step_alone(recipe):
    """The DP-Merging trainer is the same LP-FT recipe with DP-SAT (ρ 0.05) and alignment (λ 0.05) in phase 2."""
    sgd, dpm = (train_script.parse_arguments([*lpft.flags("minilm", c, lpft.EPSILON), "--task", "rotten_tomatoes"])
                for c in lpft_merge.trainers(recipe).values())
    assert (sgd[1].sam_mode, sgd[1].align_lambda) == ("none", 0.0)
    assert (dpm[1].sam_mode, dpm[1].sam_rho, dpm[1].align_lambda) == ("dp_sat", 0.05, 0.05)
    for ours, theirs in zip(sgd, dpm):
        differing = {f.name for f in dataclasses.fields(ours) if getattr(ours, f.name) != getattr(theirs, f.name)}
        assert differing <= {"sam_mode", "sam_rho", "align_lambda"}


def test_the_merge_report_reads_the_private_heads_at_epsilon_8_only():
    units = [unit("rotten_tomatoes", lpft.HEAD, 1, 0.8, 0.77), unit("rotten_tomatoes", lpft.HEAD, 1, 0.8, 0.70, 4.0),
             unit("rotten_tomatoes", lpft.DEFAULT_CANDIDATE, 1, 0.8, 0.79)]
    assert lpft_merge.private_heads(units) == {("rotten_tomatoes", 1): pytest.approx(77.0)}


@pytest.mark.slow
def test_the_merge_benchmark_merges_and_scores_kept_adapters_end_to_end(tmp_path):
    """Two tiny LP-FT adapters (the default recipe, shortened) kept as both trainers' units of one seed: each
    method merges them and scores them on the whole test splits, and identical adapters under both trainer names
    give identical scores (the comparison measures the adapters and nothing else)."""
    import shutil

    from hf_dpmerge.scripts import train as train_glue
    from tests.utils.tiny_models import save_tiny_bert

    base_model = save_tiny_bert(tmp_path / "tiny")
    tasks = list(TWO_TASKS)
    train_glue.main(["--model_name_or_path", str(base_model), "--runs_dir", str(tmp_path / "runs"), "--tasks",
                     ",".join(tasks), "--max_train_samples", "64", "--per_device_train_batch_size", "16",
                     "--physical_batch_size", "16", "--max_steps", "2", "--head_phase_steps", "2",
                     "--head_phase_batch_size", "16", "--max_length", "16", "--lora_layers", "top_1"])
    for trainer in TRAINERS:
        for task in tasks:
            shutil.copytree(tmp_path / "runs" / task, lpft_merge.kept_adapter(tmp_path / "kept", task, trainer, 0),
                            ignore=shutil.ignore_patterns("checkpoints*"))
    lpft_merge.main(["--kept", str(tmp_path / "kept"), "--base", str(tmp_path / "runs" / "base"), "--work-dir",
                     str(tmp_path / "work"), "--units-dir", str(tmp_path / "units"), "--report",
                     str(tmp_path / "LPFT_MERGE.md"), "--methods", "ties,dp_aware", "--tasks", ",".join(tasks)])
    units = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "units").glob("*.json")}
    assert len(units) == len(TRAINERS) * 2
    assert not any(str(tmp_path) in p.read_text() for p in (tmp_path / "units").glob("*.json"))  # no local path
    for method in ("ties", "dp_aware"):
        sgd, dpm = (units[lpft_merge.unit_name(t, 0, method)]["evaluation"]["tasks"] for t in TRAINERS)
        assert sgd == dpm
        assert all(sgd[t]["num_examples"] > 500 for t in tasks)  # whole test splits
    report = (tmp_path / "LPFT_MERGE.md").read_text()
    assert "| ties | 0 | +0.00 | +0.00 | — | — |" in report
    for trainer in TRAINERS:  # --as-adapter: dp_aware's adapter is its dense merge; ties has none
        assert "as_adapter" not in units[lpft_merge.unit_name(trainer, 0, "ties")]
        check = units[lpft_merge.unit_name(trainer, 0, "dp_aware")]["as_adapter"]
        assert check["max_abs_difference"] < 1e-5 < 1e-3 < check["max_abs_task_vector"]
        assert check["dense_bytes"] > check["adapter_bytes"] > 0
        assert f"| dp_aware | {trainer} | 1 |" in report


