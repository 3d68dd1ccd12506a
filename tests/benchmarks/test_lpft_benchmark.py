"""The LP-FT search and the headroom table: units parse as the training script runs them, the choice uses the
select tasks' validation splits only, and the report's tests treat seeds as the unit (Holm over tasks)."""

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

import pytest
from scipy import stats

from benchmarks import lpft, lpft_merge
from benchmarks.merge_comparison import METHODS, TRAINERS
from benchmarks.quality.significance import holm
from benchmarks.studies import headroom
from benchmarks.studies.headroom import Headroom
from hf_dpmerge.scripts import train as train_script


@pytest.mark.parametrize("candidate", [*lpft.CANDIDATES, *lpft.TWINS])
def test_every_candidate_parses_as_a_private_run_at_the_target_epsilon(candidate):
    script, config = train_script.parse_arguments(lpft.arguments("rotten_tomatoes", candidate, 0, Path("/r/x")))
    assert config.dp and config.target_epsilon == lpft.EPSILON and script.prefix_cache_dir == "/r/prefix_cache"
    if candidate == lpft.HEAD:
        assert not script.train_lora and script.head_phase_epsilon is None
    else:  # LP-FT: a head phase at a smaller ε, then FFA-LoRA on the top layers of the cached prefix
        assert script.train_lora and 0 < script.head_phase_epsilon < lpft.EPSILON and script.lora_freeze_a
        assert script.lora_layers.startswith("top_") and script.cache_prefix == "true"


@pytest.mark.parametrize("candidate", list(lpft.SMOLLM2_CANDIDATES))
def test_a_smollm2_unit_trains_its_built_base_as_a_classifier_with_lora_on_q_and_v(candidate):
    smollm2 = lpft.BASES["smollm2"]
    argv = lpft.arguments("rotten_tomatoes", candidate, 0, Path("/r/x"), base=smollm2)
    script, config = train_script.parse_arguments(argv)
    assert script.model_name_or_path == str(lpft.smollm2_base_dir(Path("/r"))) == "/r/smollm2_base"
    assert script.lora_target_modules == "q_proj,v_proj" and config.dp and config.target_epsilon == lpft.EPSILON
    assert script.train_lora == (candidate != lpft.HEAD)
    assert "--model_name_or_path" not in lpft.arguments("rotten_tomatoes", lpft.HEAD, 0, Path("/r/x"))  # MiniLM's


def test_the_smollm2_base_is_built_once_and_never_left_half_written(tmp_path, monkeypatch):
    from hf_dpmerge.data import model_path
    from hf_dpmerge.modeling import causal_base

    calls = []

    def save(source, directory):
        calls.append(Path(directory).name)
        Path(directory).mkdir(parents=True)
        if len(calls) == 1:
            raise OSError("disk full")
        (Path(directory) / "config.json").write_text("{}")

    monkeypatch.setattr(model_path, "default_causal_gguf", lambda: Path("smollm2.gguf"))
    monkeypatch.setattr(causal_base, "save_causal_base", save)
    with pytest.raises(OSError):
        lpft.ensure_smollm2_base(tmp_path)
    assert not lpft.smollm2_base_dir(tmp_path).exists()  # a failed build leaves no base a later unit would trust
    assert lpft.ensure_smollm2_base(tmp_path) == lpft.smollm2_base_dir(tmp_path)
    assert lpft.ensure_smollm2_base(tmp_path) == lpft.smollm2_base_dir(tmp_path)
    assert calls == ["smollm2_base.partial"] * 2 and (tmp_path / "smollm2_base" / "config.json").exists()


def test_a_smollm2_search_chooses_among_its_own_candidates_and_writes_no_floor_gap(tmp_path):
    smollm2 = lpft.BASES["smollm2"]
    candidates = [c for c in smollm2.candidates if c != lpft.HEAD]
    units = [unit(t, lpft.HEAD, 0, 0.80, 0.80) for t in lpft.SELECT_TASKS]
    units += [unit(t, c, 0, 0.80 + 0.01 * i, 0.81) for i, c in enumerate(candidates) for t in lpft.SELECT_TASKS]
    assert lpft.chosen_candidate(units)[0] is None  # MiniLM's search lacks its own candidates' units
    chosen, _ = lpft.chosen_candidate(units, smollm2.candidates)
    assert chosen == candidates[-1]
    text = lpft.write_report(units, tmp_path / "LPFT.md", evidence=smollm2.evidence, base=smollm2)
    assert smollm2.evidence is None and "`python -m benchmarks.lpft --base smollm2 --report-only`" in text
    assert f"Chosen: `{chosen}`." in text and "--model_name_or_path <work>/smollm2_base" in text



def test_a_partial_select_stage_shows_no_time_for_a_candidate_without_units(tmp_path):
    smollm2 = lpft.BASES["smollm2"]
    units = [unit(t, lpft.HEAD, 0, 0.80, 0.80) for t in lpft.SELECT_TASKS]  # only the heads stored so far
    text = lpft.write_report(units, tmp_path / "LPFT.md", evidence=smollm2.evidence, base=smollm2)
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert rows[lpft.HEAD].endswith("| — | 1.0 |")  # the head's longest unit: 60 s
    assert all(rows[c].endswith("| — | — | — | — |") for c in smollm2.candidates if c != lpft.HEAD)
    assert "Chosen: — (select stage incomplete)." in text

def test_a_candidate_at_another_epsilon_keeps_its_head_phase_share():
    candidate = next(c for c in lpft.CANDIDATES if c != lpft.HEAD)
    at = {e: train_script.parse_arguments(lpft.arguments("rotten_tomatoes", candidate, 0, Path("/r/x"), e))
          for e in (8.0, 4.0)}
    assert at[4.0][1].target_epsilon == 4.0
    assert at[4.0][0].head_phase_epsilon / 4.0 == pytest.approx(at[8.0][0].head_phase_epsilon / 8.0)
    assert lpft.unit_name("rotten_tomatoes", candidate, 1) == f"rotten_tomatoes-{candidate}-seed1"  # stored names
    assert lpft.unit_name("rotten_tomatoes", candidate, 1, 4.0) == f"rotten_tomatoes-{candidate}-seed1-eps4"


def unit(task, candidate, seed, validation, test, epsilon=None):
    stored = {"task": task, "candidate": candidate, "seed": seed, "validation": {"accuracy": validation},
              "test": {"accuracy": test}, "train_seconds": 60.0}
    return stored if epsilon is None else stored | {"target_epsilon": epsilon}


def select_units(gains: dict[str, float]) -> list[dict]:
    units = [unit(t, lpft.HEAD, 0, 0.80, 0.80) for t in lpft.SELECT_TASKS]
    return units + [unit(t, c, 0, 0.80 + g, 0.0) for c, g in gains.items() for t in lpft.SELECT_TASKS]


def test_the_choice_waits_for_every_select_unit_and_takes_the_best_mean_validation_gain():
    candidates = [c for c in lpft.CANDIDATES if c != lpft.HEAD]
    gains = {c: 0.01 * i for i, c in enumerate(candidates)}
    units = select_units(gains)
    assert lpft.chosen_candidate(units[:-1])[0] is None
    chosen, mean_gains = lpft.chosen_candidate(units)
    assert chosen == candidates[-1] and mean_gains[chosen] == pytest.approx(100 * gains[chosen])
    held_out = [unit("reuters_r8", candidates[0], 0, 0.99, 0.99), unit("reuters_r8", lpft.HEAD, 0, 0.5, 0.5)]
    assert lpft.chosen_candidate(units + held_out)[0] == chosen  # a held-out task never chooses


def test_a_select_run_trains_only_the_missing_units_of_the_candidates_it_names(tmp_path, monkeypatch):
    """Two select processes can share the search (``--candidates``), each skipping what is stored."""
    trained = []

    def run_unit(task, argv, seed, work_dir, path, keep=None, **about):
        trained.append((task, about["candidate"]))
        path.write_text(json.dumps(unit(task, about["candidate"], seed, 0.8, 0.8)))

    monkeypatch.setattr(lpft, "run_unit", run_unit)
    monkeypatch.setattr(lpft, "write_report", lambda *args, **kwargs: "")  # never the committed report
    candidate = next(c for c in lpft.CANDIDATES if c != lpft.HEAD)
    (tmp_path / f"{lpft.unit_name('bbc_news', lpft.HEAD, 0)}.json").write_text(
        json.dumps(unit("bbc_news", lpft.HEAD, 0, 0.8, 0.8)))
    argv = ["--stage", "select", "--candidates", f"{lpft.HEAD},{candidate}", "--units-dir", str(tmp_path),
            "--work-dir", str(tmp_path / "work")]
    assert lpft.main(argv) == 0
    assert trained == [("rotten_tomatoes", lpft.HEAD), ("rotten_tomatoes", candidate), ("bbc_news", candidate)]
    assert lpft.main(argv) == 0 and len(trained) == 3  # resumed: nothing left to train
    with pytest.raises(SystemExit):
        lpft.main(["--stage", "select", "--candidates", "k9_unknown", "--units-dir", str(tmp_path)])
    report = ["--stage", "report", "--seeds", "1", "--tasks", "election_tweets", "--units-dir", str(tmp_path),
              "--work-dir", str(tmp_path / "work")]
    with pytest.raises(SystemExit):  # the select stage is incomplete: no chosen candidate to report
        lpft.main(report)
    assert len(trained) == 3
    assert lpft.main([*report, "--candidates", candidate]) == 0  # a named candidate needs no choice
    assert trained[3:] == [("election_tweets", candidate)]


def test_the_report_says_when_the_private_head_beats_every_candidate_on_validation(tmp_path):
    candidates = [c for c in lpft.CANDIDATES if c != lpft.HEAD]
    below = lpft.write_report(select_units({c: -0.01 - 0.01 * i for i, c in enumerate(candidates)}),
                              tmp_path / "below.md", evidence=None)
    assert f"Chosen: `{candidates[0]}`." in below and "beats them all (the chosen one by 1.00 points)" in below
    above = lpft.write_report(select_units({c: 0.0 for c in candidates[:-1]} | {candidates[-1]: 0.001}),
                              tmp_path / "above.md", evidence=None)
    assert f"Chosen: `{candidates[-1]}`." in above and "beats them all" not in above


def test_the_report_tests_each_task_over_seeds_and_corrects_with_holm(tmp_path):
    chosen = lpft.DEFAULT_CANDIDATE  # chosen and the default: one table
    units = select_units({c: 0.01 for c in lpft.CANDIDATES if c != lpft.HEAD} | {chosen: 0.02})
    head = {"rotten_tomatoes": [0.80, 0.81, 0.79], "election_tweets": [0.88, 0.89, 0.90]}
    ours = {"rotten_tomatoes": [0.83, 0.83, 0.82], "election_tweets": [0.885, 0.90, 0.89]}
    units = [u for u in units if not (u["task"] == "rotten_tomatoes" and u["seed"] == 0 and u["candidate"] in
                                      (lpft.HEAD, chosen))]
    for task in head:
        for seed in range(3):
            units += [unit(task, lpft.HEAD, seed, 0.8, head[task][seed]),
                      unit(task, chosen, seed, 0.82, ours[task][seed])]
    text = lpft.write_report(units, tmp_path / "LPFT.md", evidence=tmp_path / "gap.json")
    p = [stats.ttest_rel([100 * x for x in ours[t]], [100 * x for x in head[t]]).pvalue
         for t in ("rotten_tomatoes", "election_tweets")]
    adjusted = holm(p)
    rotten = next(line for line in text.splitlines() if line.startswith("| rotten_tomatoes (select)"))
    election = next(line for line in text.splitlines() if line.startswith("| election_tweets |"))
    assert f"{p[0]:.3g}" in rotten and f"{adjusted[0]:.3g}" in rotten
    assert f"{p[1]:.3g}" in election and f"{adjusted[1]:.3g}" in election
    assert "+3.0 +2.0 +3.0 | +2.67" in rotten  # the paired per-seed gains and their mean
    # recommend's gap: the task average over the tasks of seed 0, on the seeds that hold all of them
    gap = json.loads((tmp_path / "gap.json").read_text())
    assert gap["recipe"] == chosen and gap["rows"][0]["tasks"] == ["rotten_tomatoes", "election_tweets", "bbc_news"]
    assert gap["rows"][0]["seeds"] == [0] and gap["rows"][0]["p"] is None  # bbc_news has seed 0 only
    head["bbc_news"], ours["bbc_news"] = [0.80, 0.95, 0.94], [0.0, 0.96, 0.955]  # seed 0: its select units
    units += [unit("bbc_news", c, seed, 0.8, scores[seed]) for seed in (1, 2)
              for c, scores in ((lpft.HEAD, head["bbc_news"]), (chosen, ours["bbc_news"]))]
    gap = lpft.floor_gap(units)
    ours_avg = [100 * sum(ours[t][s] for t in ours) / 3 for s in range(3)]
    head_avg = [100 * sum(head[t][s] for t in head) / 3 for s in range(3)]
    row = gap["rows"][0]
    assert row["seeds"] == [0, 1, 2] and row["epsilon"] == lpft.EPSILON
    assert row["difference"] == pytest.approx(sum(ours_avg) / 3 - sum(head_avg) / 3, abs=0.01)
    assert row["p"] == pytest.approx(stats.ttest_rel(ours_avg, head_avg).pvalue)


def test_a_choice_other_than_the_default_is_reported_beside_it_and_the_floor_gap_stays_the_defaults(tmp_path):
    default = lpft.DEFAULT_CANDIDATE
    base = dataclasses.replace(lpft.MINILM, earlier_defaults=())  # the choice and the default alone
    chosen = next(c for c in lpft.CANDIDATES if c not in (lpft.HEAD, default))
    units = select_units({c: 0.0 for c in lpft.CANDIDATES if c != lpft.HEAD} | {chosen: 0.02})
    head, ours = [0.80, 0.81, 0.79], [0.83, 0.83, 0.82]
    units = [u for u in units if not (u["task"] == "rotten_tomatoes" and u["candidate"] in (lpft.HEAD, default))]
    units += [unit("rotten_tomatoes", c, seed, 0.8, scores[seed]) for seed in range(3)
              for c, scores in ((lpft.HEAD, head), (default, ours))]
    text = lpft.write_report(units, tmp_path / "LPFT.md", evidence=tmp_path / "gap.json", headroom_units=[],
                             base=base)
    assert f"Chosen: `{chosen}`." in text and f"The default (`LPFT_RECIPE`) is still `{default}`" in text
    report = text[text.index("## Report"):text.index("## Targets")]
    assert report.index(f"### `{chosen}` (chosen)") < report.index(f"### `{default}` (the default)")
    p = stats.ttest_rel([100 * x for x in ours], [100 * x for x in head]).pvalue
    row = next(line for line in report.split(f"### `{default}`")[1].splitlines()
               if line.startswith("| rotten_tomatoes (select) | 8 | 0,1,2 |"))
    assert f"| {p:.3g} | {p:.3g} * |" in row  # the chosen one's rows are single seeds: one tested row in all
    assert text.count("### `") == 4  # report and targets, one table each
    gap = json.loads((tmp_path / "gap.json").read_text())
    assert gap["recipe"] == default and gap["rows"][0]["adapters"] == pytest.approx(
        statistics.mean([100 * ours[0], 0.0]))  # rotten_tomatoes and bbc_news at seed 0 (select units test 0.0)
    one = lpft.write_report(select_units({c: 0.0 for c in lpft.CANDIDATES if c != lpft.HEAD} | {default: 0.01}),
                            tmp_path / "one.md", evidence=None, base=base)
    assert "### `" not in one and "is still" not in one


def test_an_earlier_default_keeps_its_rows_as_a_holm_family_of_its_own(tmp_path):
    default, (earlier, *_) = lpft.DEFAULT_CANDIDATE, lpft.EARLIER_DEFAULTS
    assert earlier != default and earlier in lpft.CANDIDATES
    units = select_units({c: 0.0 for c in lpft.CANDIDATES if c != lpft.HEAD} | {default: 0.02})
    head = [0.80, 0.81, 0.79]
    scores = {default: [0.83, 0.83, 0.82], earlier: [0.82, 0.815, 0.80]}
    units = [u for u in units if u["task"] != "rotten_tomatoes" or u["candidate"] not in (lpft.HEAD, *scores)]
    units += [unit("rotten_tomatoes", c, seed, 0.8, values[seed]) for seed in range(3)
              for c, values in ((lpft.HEAD, head), *scores.items())]
    election = {lpft.HEAD: [0.88, 0.89, 0.90], default: [0.885, 0.90, 0.89]}  # a second row of the default's
    units += [unit("election_tweets", c, seed, 0.8, values[seed]) for seed in range(3)
              for c, values in election.items()]
    text = lpft.write_report(units, tmp_path / "LPFT.md", evidence=tmp_path / "gap.json", headroom_units=[])
    assert f"Chosen: `{default}`." in text and "is still" not in text and f"`{earlier}`." in text
    report = text[text.index("## Report"):text.index("## Targets")]
    assert (report.index(f"### `{default}` (chosen, the default)")
            < report.index(f"### `{earlier}` (an earlier default)"))
    def p_value(ours, theirs):
        return stats.ttest_rel([100 * x for x in ours], [100 * x for x in theirs]).pvalue

    ours = holm([p_value(scores[default], head), p_value(election[default], election[lpft.HEAD])])
    theirs = p_value(scores[earlier], head)  # alone in its family: unadjusted
    for candidate, raw, adjusted in ((default, p_value(scores[default], head), ours[0]), (earlier, theirs, theirs)):
        row = next(line for line in report.split(f"### `{candidate}`")[1].splitlines()
                   if line.startswith("| rotten_tomatoes (select) | 8 | 0,1,2 |"))
        assert f"| {raw:.3g} | {adjusted:.3g}" in row  # Holm over the recipe's own tested rows
    assert text.count("### `") == 4
    assert json.loads((tmp_path / "gap.json").read_text())["recipe"] == default  # recommend reads the default


def test_the_training_scripts_lora_default_is_the_default_candidate():
    """LPFT_RECIPE is what the benchmark measured as DEFAULT_CANDIDATE: both parse to the same training."""
    script, config = train_script.parse_arguments([])
    ours, theirs = train_script.parse_arguments(lpft.arguments("rotten_tomatoes", lpft.DEFAULT_CANDIDATE, 0,
                                                               Path("/r/x")))
    assert train_script.head_phase_epsilon(script, config) == train_script.head_phase_epsilon(ours, theirs)
    for field in ("lora_layers", "lora_r", "lora_alpha", "lora_target_modules", "lora_freeze_a", "train_lora"):
        assert getattr(script, field) == getattr(ours, field), field
    for field in ("per_device_train_batch_size", "max_steps", "learning_rate", "head_learning_rate",
                  "head_warmup_steps", "sam_mode", "align_lambda", "clipping", "per_sample_max_grad_norm",
                  "lr_scheduler_type", "optim", "weight_decay", "target_epsilon"):
        assert getattr(config, field) == getattr(theirs, field), field


def test_units_at_another_epsilon_never_choose_and_get_their_own_rows(tmp_path):
    candidates = [c for c in lpft.CANDIDATES if c != lpft.HEAD]
    units = select_units({c: 0.01 * i for i, c in enumerate(candidates)})
    chosen = lpft.chosen_candidate(units)[0]
    head, ours = [0.70, 0.71, 0.69], [0.71, 0.715, 0.70]
    at_four = [unit("rotten_tomatoes", c, s, 0.99 if c != chosen else 0.0, scores[s], epsilon=4.0)
               for s in range(3) for c, scores in ((lpft.HEAD, head), *((c, ours) for c in candidates))]
    assert lpft.chosen_candidate(units + at_four)[0] == chosen  # ε = 4's validation scores do not choose
    gap = lpft.floor_gap(units + at_four)
    assert [row["epsilon"] for row in gap["rows"]] == [8.0, 4.0]
    four = gap["rows"][1]
    assert four["tasks"] == ["rotten_tomatoes"] and four["seeds"] == [0, 1, 2]
    assert four["p"] == pytest.approx(stats.ttest_rel([100 * x for x in ours], [100 * x for x in head]).pvalue)
    text = lpft.write_report(units + at_four, tmp_path / "LPFT.md", evidence=None)
    row = next(line for line in text.splitlines() if line.startswith("| rotten_tomatoes (select) | 4 | 0,1,2 |"))
    assert "+1.0 +0.5 +1.0 | +0.83" in row


def test_recommend_reads_the_gap_of_the_stored_units():
    """What ``hf-dpmerge recommend`` reads is what the committed units give (rerun --report-only after adding)."""
    stored = json.loads(lpft.FLOOR_GAP_EVIDENCE.read_text())
    assert stored == json.loads(json.dumps(lpft.floor_gap(lpft.load_units(lpft.REPORT_DIR / "units"))))


def headroom_unit(task, arm, seed, test):
    return {"name": f"{task}-{arm}-seed{seed}", "settings": {"task": task, "arm": arm, "seed": seed},
            "result": {"validation": {"accuracy": test}, "test": {"accuracy": test}, "train_seconds": 60.0}}


def test_a_headroom_task_is_one_whose_best_adapter_beats_the_head_by_two_test_points():
    units = [headroom_unit(t, arm, 0, v)
             for t, scores in {"rotten_tomatoes": (0.77, 0.81, 0.80), "bbc_news": (0.95, 0.96, 0.965)}.items()
             for arm, v in zip(headroom.ARMS, scores)]
    assert "Headroom tasks (≥ 2 points): rotten_tomatoes." in Headroom().report(units)["HEADROOM.md"]


def test_the_headroom_is_the_budget_arms_seed_mean_over_the_heads_and_the_ceiling_is_reported_apart():
    units = [headroom_unit("rotten_tomatoes", "head", s, v) for s, v in ((0, 0.76), (1, 0.78))]
    units += [headroom_unit("rotten_tomatoes", "lora_top2", s, v) for s, v in ((0, 0.80), (1, 0.81))]
    units += [headroom_unit("rotten_tomatoes", "lora_all", 0, 0.835), headroom_unit("bbc_news", "head", 0, 0.9)]
    # the ceiling (all six layers) is better, but the headroom is what the budget's arm gains
    assert lpft.headroom_points(units) == {"rotten_tomatoes": pytest.approx(100 * (0.805 - 0.77))}
    text = Headroom().report(units)["HEADROOM.md"]
    assert "| rotten_tomatoes | 0,1 | 77.0 / 77.0 | 80.5 / 80.5 | 83.5 / 83.5 | 3.5 | 6.5 |" in text
    assert "| bbc_news | 0 | 90.0 / 90.0 | — / — | — / — | — | — |" in text  # no LoRA arm: no headroom


@pytest.mark.parametrize(("epsilon", "gain", "significant", "headroom_points", "expected"), [
    (8.0, -0.31, False, None, ["not met (-0.31)", "—", "—", "—"]),
    (8.0, -0.3, False, 1.0, ["holds (-0.30)", "1.0", "-30 %", "— (not a headroom task)"]),
    (8.0, 1.5, True, 3.0, ["holds (+1.50)", "3.0", "50 %",
                           "holds (≥ +1, Holm-significant); holds (≥ 50 % of the headroom)"]),
    (8.0, 1.5, False, 3.0, ["holds (+1.50)", "3.0", "50 %",
                            "not met (≥ +1, Holm-significant); holds (≥ 50 % of the headroom)"]),
    (8.0, 1.2, True, 3.0, ["holds (+1.20)", "3.0", "40 %",
                           "holds (≥ +1, Holm-significant); not met (≥ 50 % of the headroom)"]),
    (4.0, 0.5, False, 2.0, ["holds (+0.50)", "2.0", "25 %", "holds (≥ +0.5)"]),
    (4.0, 0.49, True, 2.0, ["holds (+0.49)", "2.0", "24 %", "not met (≥ +0.5)"]),
    (1.0, 0.1, False, 2.0, ["holds (+0.10)", "2.0", "5 %", "—"]),
])
def test_each_report_row_is_judged_against_the_issues_targets(epsilon, gain, significant, headroom_points, expected):
    assert lpft.target_verdicts(epsilon, gain, significant, headroom_points) == expected


def test_the_report_states_each_rows_targets_from_the_headroom_units(tmp_path):
    candidates = [c for c in lpft.CANDIDATES if c != lpft.HEAD]
    units = select_units({c: 0.01 * (i + 1) for i, c in enumerate(candidates)})
    chosen = lpft.chosen_candidate(units)[0]
    units += [unit("20newsgroups", lpft.HEAD, 0, 0.8, 0.74), unit("20newsgroups", chosen, 0, 0.8, 0.73)]
    stored = [headroom_unit("20newsgroups", "head", 0, 0.75), headroom_unit("20newsgroups", "lora_top2", 0, 0.78)]
    text = lpft.write_report(units, tmp_path / "LPFT.md", evidence=None, headroom_units=stored)
    row = next(line for line in text.splitlines() if line.startswith("| 20newsgroups | 8 | 0 | not met"))
    assert row.split(" | ")[3:] == ["not met (-1.00)", "3.0", "-33 %",
                                    "not met (≥ +1, Holm-significant); not met (≥ 50 % of the headroom) |"]
    assert "## Targets" not in lpft.write_report(units, tmp_path / "LPFT.md", evidence=None)


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
        (tmp_path / f"{lpft.unit_name(task, lpft.DEFAULT_CANDIDATE, 3, 4.0)}" / task).mkdir(parents=True)
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
    monkeypatch.setattr(lpft, "load_units", lambda units_dir: heads)
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
    sgd, dpm = (train_script.parse_arguments(lpft.arguments("rotten_tomatoes", c, 0, Path("/r/x")))
                for c in lpft_merge.trainers(recipe).values())
    assert (sgd[1].sam_mode, sgd[1].align_lambda) == ("none", 0.0)
    assert (dpm[1].sam_mode, dpm[1].sam_rho, dpm[1].align_lambda) == ("dp_sat", 0.05, 0.05)
    for ours, theirs in zip(sgd, dpm):
        differing = {f.name for f in dataclasses.fields(ours) if getattr(ours, f.name) != getattr(theirs, f.name)}
        assert differing <= {"sam_mode", "sam_rho", "align_lambda"}


def test_a_twin_runs_in_the_report_stage_only_and_never_takes_part_in_the_choice(tmp_path, monkeypatch, capsys):
    twin = next(iter(lpft.TWINS))
    assert twin not in lpft.CANDIDATES and twin in lpft_merge.TWIN.values()
    with pytest.raises(SystemExit):
        lpft.main(["--stage", "select", "--candidates", twin, "--units-dir", str(tmp_path)])
    assert "run in the report stage only (--stage report)" in capsys.readouterr().err
    trained = []
    monkeypatch.setattr(lpft, "run_unit", lambda task, argv, *a, candidate, **k: trained.append((task, candidate)))
    monkeypatch.setattr(lpft, "write_report", lambda *a, **k: "")
    assert lpft.main(["--stage", "report", "--tasks", "rotten_tomatoes", "--candidates", twin, "--units-dir",
                      str(tmp_path), "--work-dir", str(tmp_path / "work")]) == 0
    assert trained == [("rotten_tomatoes", twin)]
    units = select_units({c: 0.0 for c in lpft.CANDIDATES if c != lpft.HEAD} | {lpft.DEFAULT_CANDIDATE: 0.01})
    assert lpft.chosen_candidate(units + [unit(t, twin, 0, 0.99, 0.99) for t in lpft.SELECT_TASKS])[0] \
        == lpft.DEFAULT_CANDIDATE


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


def test_every_headroom_arm_parses_as_a_non_private_run():
    parser = argparse.ArgumentParser()
    Headroom().add_arguments(parser)
    for unit in Headroom().plan(parser.parse_args(["--tasks", "rotten_tomatoes"])):
        script, config = train_script.parse_arguments([*unit.settings["flags"], "--task", "rotten_tomatoes"])
        assert not config.dp and script.train_lora == (unit.settings["arm"] != "head")
