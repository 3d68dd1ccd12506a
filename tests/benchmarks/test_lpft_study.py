"""The LP-FT search and the headroom table: units parse as the training script runs them, the choice uses the
select tasks' validation splits only, the report's tests treat seeds as the unit (Holm per recipe), and the floor gap
the package reads is the export of the stored units."""

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

import pytest
from scipy import stats

from benchmarks import harness
from benchmarks.significance import holm
from benchmarks.studies import headroom, lpft
from benchmarks.studies.headroom import Headroom
from hf_dpmerge.scripts import train as train_script

MINILM = lpft.BASES["minilm"]


@pytest.mark.parametrize("candidate", [*lpft.CANDIDATES, *lpft.TWINS])
def test_every_candidate_parses_as_a_private_run_at_the_target_epsilon(candidate):
    script, config = parse(lpft.lpft_unit("minilm", "rotten_tomatoes", candidate, 0))
    assert config.dp and config.target_epsilon == lpft.EPSILON
    if candidate == lpft.HEAD:
        assert not script.train_lora and script.head_phase_epsilon is None
    else:  # LP-FT: a head phase at a smaller ε, then FFA-LoRA on the top layers of the cached prefix
        assert script.train_lora and 0 < script.head_phase_epsilon < lpft.EPSILON and script.lora_freeze_a
        assert script.lora_layers.startswith("top_") and script.cache_prefix == "true"


@pytest.mark.parametrize("candidate", list(lpft.SMOLLM2_CANDIDATES))
def test_a_smollm2_unit_trains_its_built_base_as_a_classifier_with_lora_on_q_and_v(candidate, monkeypatch):
    trained = []
    monkeypatch.setattr(lpft, "ensure_smollm2_base", lambda work_dir: work_dir / "smollm2_base")
    monkeypatch.setattr(lpft, "train_unit", lambda task, argv, seed, work_dir, name, keep: trained.append(
        (argv, work_dir, name, keep)) or {})
    unit = lpft.lpft_unit("smollm2", "rotten_tomatoes", candidate, 0)
    lpft.Lpft().run(unit, Path("/r"))
    (argv, work_dir, name, keep), = trained
    script, config = train_script.parse_arguments([*argv, "--task", "rotten_tomatoes"])
    assert script.model_name_or_path == "/r/smollm2/smollm2_base" and work_dir == Path("/r/smollm2")
    assert script.lora_target_modules == "q_proj,v_proj" and config.dp and config.target_epsilon == lpft.EPSILON
    assert script.train_lora == keep == (candidate != lpft.HEAD)
    assert name == f"smollm2-rotten_tomatoes-{candidate}-seed0"
    assert "--lora_target_modules" not in lpft.lpft_unit("minilm", "rotten_tomatoes", lpft.HEAD, 0).settings["flags"]


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
    assert not (tmp_path / "smollm2_base").exists()  # a failed build leaves no base a later unit would trust
    assert lpft.ensure_smollm2_base(tmp_path) == tmp_path / "smollm2_base"
    assert lpft.ensure_smollm2_base(tmp_path) == tmp_path / "smollm2_base"
    assert calls == ["smollm2_base.partial"] * 2 and (tmp_path / "smollm2_base" / "config.json").exists()


def test_a_smollm2_search_chooses_among_its_own_candidates_and_writes_no_floor_gap():
    smollm2 = lpft.BASES["smollm2"]
    candidates = [c for c in smollm2.candidates if c != lpft.HEAD]
    units = [unit(t, lpft.HEAD, 0, 0.80, 0.80) for t in lpft.SELECT_TASKS]
    units += [unit(t, c, 0, 0.80 + 0.01 * i, 0.81) for i, c in enumerate(candidates) for t in lpft.SELECT_TASKS]
    assert lpft.chosen_candidate(units)[0] is None  # MiniLM's search lacks its own candidates' units
    chosen, _ = lpft.chosen_candidate(units, smollm2.candidates)
    assert chosen == candidates[-1]
    study = lpft.Lpft()
    stored = [as_stored(u, "smollm2") for u in units]
    text = study.report(stored)["LPFT_SMOLLM2.md"]
    assert f"Chosen: `{chosen}`." in text and "--model_name_or_path <work>/smollm2_base" in text
    assert "from 0 stored units" in study.report(stored)["LPFT.md"]
    assert json.loads(study.exports(stored)[lpft.FLOOR_GAP])["rows"] == []



def test_a_partial_select_stage_shows_no_time_for_a_candidate_without_units():
    smollm2 = lpft.BASES["smollm2"]
    units = [unit(t, lpft.HEAD, 0, 0.80, 0.80) for t in lpft.SELECT_TASKS]  # only the heads stored so far
    text = lpft.lpft_report(units, smollm2, None)
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert rows[lpft.HEAD].endswith("| — | 1.0 |")  # the head's longest unit: 60 s
    assert all(rows[c].endswith("| — | — | — | — |") for c in smollm2.candidates if c != lpft.HEAD)
    assert "Chosen: — (select stage incomplete)." in text

def test_a_candidate_at_another_epsilon_keeps_its_head_phase_share():
    candidate = next(c for c in lpft.CANDIDATES if c != lpft.HEAD)
    at = {e: parse(lpft.lpft_unit("minilm", "rotten_tomatoes", candidate, 0, e)) for e in (8.0, 4.0)}
    assert at[4.0][1].target_epsilon == 4.0
    assert at[4.0][0].head_phase_epsilon / 4.0 == pytest.approx(at[8.0][0].head_phase_epsilon / 8.0)
    assert lpft.lpft_unit("minilm", "rotten_tomatoes", candidate, 1).name == f"rotten_tomatoes-{candidate}-seed1"
    assert lpft.lpft_unit("minilm", "rotten_tomatoes", candidate, 1, 4.0).name == (
        f"rotten_tomatoes-{candidate}-seed1-eps4")


def unit(task, candidate, seed, validation, test, epsilon=lpft.EPSILON):
    """A unit as the report reads it (:func:`lpft.flat`): settings and result in one dict."""
    return {"task": task, "candidate": candidate, "seed": seed, "target_epsilon": epsilon,
            "validation": {"accuracy": validation}, "test": {"accuracy": test}, "train_seconds": 60.0}


def as_stored(flat_unit, base="minilm"):
    """``flat_unit`` as the store gives it."""
    settings = {k: flat_unit[k] for k in ("task", "candidate", "seed", "target_epsilon")} | {"base": base}
    return {"name": "-".join(map(str, settings.values())), "settings": settings,
            "result": {k: v for k, v in flat_unit.items() if k not in settings}}


def parse(lpft_unit):
    return train_script.parse_arguments([*lpft_unit.settings["flags"], "--task", lpft_unit.settings["task"]])


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


def run_lpft(argv, tmp_path, monkeypatch):
    """``python -m benchmarks.studies.lpft ARGV`` on units and reports under ``tmp_path``: what it trains."""
    trained = []

    def run(self, lpft_unit, work_dir):
        s = lpft_unit.settings
        trained.append((s["task"], s["candidate"]))
        return {k: v for k, v in unit(s["task"], s["candidate"], s["seed"], 0.8, 0.8).items() if k not in s}

    monkeypatch.setattr(lpft.Lpft, "run", run)
    harness.main(lpft.Lpft(), [*argv, "--units-dir", str(tmp_path / "units"), "--out", str(tmp_path),
                               "--work-dir", str(tmp_path / "work")], log=lambda _: None)
    return trained


def test_a_select_run_trains_only_the_missing_units_of_the_candidates_it_names(tmp_path, monkeypatch):
    """Two select processes can share the search (``--candidates``), each skipping what is stored."""
    candidate = next(c for c in lpft.CANDIDATES if c != lpft.HEAD)
    head = lpft.lpft_unit("minilm", "bbc_news", lpft.HEAD, 0)
    stored = as_stored(unit("bbc_news", lpft.HEAD, 0, 0.8, 0.8))["result"]
    harness.Store(tmp_path / "units", lpft.Lpft.schema).save(head, stored)
    argv = ["--stage", "select", "--candidates", f"{lpft.HEAD},{candidate}"]
    assert run_lpft(argv, tmp_path, monkeypatch) == [("rotten_tomatoes", lpft.HEAD), ("rotten_tomatoes", candidate),
                                                     ("bbc_news", candidate)]
    assert run_lpft(argv, tmp_path, monkeypatch) == []  # resumed: nothing left to train
    with pytest.raises(SystemExit):
        run_lpft(["--stage", "select", "--candidates", "k9_unknown"], tmp_path, monkeypatch)
    report = ["--stage", "report", "--seeds", "1", "--tasks", "election_tweets"]
    with pytest.raises(SystemExit):  # the select stage is incomplete: no chosen candidate to report
        run_lpft(report, tmp_path, monkeypatch)
    assert run_lpft([*report, "--candidates", candidate], tmp_path, monkeypatch) == [("election_tweets", candidate)]
    assert (tmp_path / lpft.FLOOR_GAP).is_file() and (tmp_path / "benchmarks/reports/lpft/LPFT.md").is_file()


def test_the_report_says_when_the_private_head_beats_every_candidate_on_validation():
    candidates = [c for c in lpft.CANDIDATES if c != lpft.HEAD]
    below = lpft.lpft_report(select_units({c: -0.01 - 0.01 * i for i, c in enumerate(candidates)}), MINILM, None)
    assert f"Chosen: `{candidates[0]}`." in below and "beats them all (the chosen one by 1.00 points)" in below
    above = lpft.lpft_report(select_units({c: 0.0 for c in candidates[:-1]} | {candidates[-1]: 0.001}), MINILM,
                             None)
    assert f"Chosen: `{candidates[-1]}`." in above and "beats them all" not in above


def test_the_report_tests_each_task_over_seeds_and_corrects_with_holm():
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
    text = lpft.lpft_report(units, MINILM, None)
    p = [stats.ttest_rel([100 * x for x in ours[t]], [100 * x for x in head[t]]).pvalue
         for t in ("rotten_tomatoes", "election_tweets")]
    adjusted = holm(p)
    rotten = next(line for line in text.splitlines() if line.startswith("| rotten_tomatoes (select)"))
    election = next(line for line in text.splitlines() if line.startswith("| election_tweets |"))
    assert f"{p[0]:.3g}" in rotten and f"{adjusted[0]:.3g}" in rotten
    assert f"{p[1]:.3g}" in election and f"{adjusted[1]:.3g}" in election
    assert "+3.0 +2.0 +3.0 | +2.67" in rotten  # the paired per-seed gains and their mean
    # recommend's gap: the task average over the tasks of seed 0, on the seeds that hold all of them
    gap = lpft.floor_gap(units)
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


def test_a_choice_other_than_the_default_is_reported_beside_it_and_the_floor_gap_stays_the_defaults():
    default = lpft.DEFAULT_CANDIDATE
    base = dataclasses.replace(MINILM, earlier_defaults=())  # the choice and the default alone
    chosen = next(c for c in lpft.CANDIDATES if c not in (lpft.HEAD, default))
    units = select_units({c: 0.0 for c in lpft.CANDIDATES if c != lpft.HEAD} | {chosen: 0.02})
    head, ours = [0.80, 0.81, 0.79], [0.83, 0.83, 0.82]
    units = [u for u in units if not (u["task"] == "rotten_tomatoes" and u["candidate"] in (lpft.HEAD, default))]
    units += [unit("rotten_tomatoes", c, seed, 0.8, scores[seed]) for seed in range(3)
              for c, scores in ((lpft.HEAD, head), (default, ours))]
    text = lpft.lpft_report(units, base, {})
    assert f"Chosen: `{chosen}`." in text and f"The default (`LPFT_RECIPE`) is still `{default}`" in text
    report = text[text.index("## Report"):text.index("## Targets")]
    assert report.index(f"### `{chosen}` (chosen)") < report.index(f"### `{default}` (the default)")
    p = stats.ttest_rel([100 * x for x in ours], [100 * x for x in head]).pvalue
    row = next(line for line in report.split(f"### `{default}`")[1].splitlines()
               if line.startswith("| rotten_tomatoes (select) | 8 | 0,1,2 |"))
    assert f"| {p:.3g} | {p:.3g} * |" in row  # the chosen one's rows are single seeds: one tested row in all
    assert text.count("### `") == 4  # report and targets, one table each
    gap = lpft.floor_gap(units)
    assert gap["recipe"] == default and gap["rows"][0]["adapters"] == pytest.approx(
        statistics.mean([100 * ours[0], 0.0]))  # rotten_tomatoes and bbc_news at seed 0 (select units test 0.0)
    one = lpft.lpft_report(select_units({c: 0.0 for c in lpft.CANDIDATES if c != lpft.HEAD} | {default: 0.01}),
                           base, None)
    assert "### `" not in one and "is still" not in one


def test_an_earlier_default_keeps_its_rows_as_a_holm_family_of_its_own():
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
    text = lpft.lpft_report(units, MINILM, {})
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
    assert lpft.floor_gap(units)["recipe"] == default  # recommend reads the default


def test_the_training_scripts_lora_default_is_the_default_candidate():
    """LPFT_RECIPE is what the benchmark measured as DEFAULT_CANDIDATE: both parse to the same training."""
    script, config = train_script.parse_arguments([])
    ours, theirs = parse(lpft.lpft_unit("minilm", "rotten_tomatoes", lpft.DEFAULT_CANDIDATE, 0))
    assert train_script.head_phase_epsilon(script, config) == train_script.head_phase_epsilon(ours, theirs)
    for field in ("lora_layers", "lora_r", "lora_alpha", "lora_target_modules", "lora_freeze_a", "train_lora"):
        assert getattr(script, field) == getattr(ours, field), field
    for field in ("per_device_train_batch_size", "max_steps", "learning_rate", "head_learning_rate",
                  "head_warmup_steps", "sam_mode", "align_lambda", "clipping", "per_sample_max_grad_norm",
                  "lr_scheduler_type", "optim", "weight_decay", "target_epsilon"):
        assert getattr(config, field) == getattr(theirs, field), field


def test_units_at_another_epsilon_never_choose_and_get_their_own_rows():
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
    text = lpft.lpft_report(units + at_four, MINILM, None)
    row = next(line for line in text.splitlines() if line.startswith("| rotten_tomatoes (select) | 4 | 0,1,2 |"))
    assert "+1.0 +0.5 +1.0 | +0.83" in row


def test_recommend_reads_the_export_of_the_stored_units():
    """What ``hf-dpmerge recommend`` reads is the study's export of the committed units (rerun --report-only)."""
    study = lpft.Lpft()
    for path, text in study.exports(harness.stored(study.name, study.schema)).items():
        assert (harness.REPO / path).read_text() == text, path


def test_a_twin_runs_in_the_report_stage_only_and_never_takes_part_in_the_choice(tmp_path, monkeypatch, capsys):
    twin = next(iter(lpft.TWINS))
    assert twin not in lpft.CANDIDATES
    with pytest.raises(SystemExit):
        run_lpft(["--stage", "select", "--candidates", twin], tmp_path, monkeypatch)
    assert "run in the report stage only (--stage report)" in capsys.readouterr().err
    assert run_lpft(["--stage", "report", "--tasks", "rotten_tomatoes", "--candidates", twin], tmp_path,
                    monkeypatch) == [("rotten_tomatoes", twin)]
    units = select_units({c: 0.0 for c in lpft.CANDIDATES if c != lpft.HEAD} | {lpft.DEFAULT_CANDIDATE: 0.01})
    assert lpft.chosen_candidate(units + [unit(t, twin, 0, 0.99, 0.99) for t in lpft.SELECT_TASKS])[0] \
        == lpft.DEFAULT_CANDIDATE


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


def test_the_report_states_each_rows_targets_from_the_headroom_units():
    candidates = [c for c in lpft.CANDIDATES if c != lpft.HEAD]
    units = select_units({c: 0.01 * (i + 1) for i, c in enumerate(candidates)})
    chosen = lpft.chosen_candidate(units)[0]
    units += [unit("20newsgroups", lpft.HEAD, 0, 0.8, 0.74), unit("20newsgroups", chosen, 0, 0.8, 0.73)]
    stored = [headroom_unit("20newsgroups", "head", 0, 0.75), headroom_unit("20newsgroups", "lora_top2", 0, 0.78)]
    text = lpft.lpft_report(units, MINILM, lpft.headroom_points(stored))
    row = next(line for line in text.splitlines() if line.startswith("| 20newsgroups | 8 | 0 | not met"))
    assert row.split(" | ")[3:] == ["not met (-1.00)", "3.0", "-33 %",
                                    "not met (≥ +1, Holm-significant); not met (≥ 50 % of the headroom) |"]
    assert "## Targets" not in lpft.lpft_report(units, MINILM, None)




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


def test_every_headroom_arm_parses_as_a_non_private_run():
    parser = argparse.ArgumentParser()
    Headroom().add_arguments(parser)
    for unit in Headroom().plan(parser.parse_args(["--tasks", "rotten_tomatoes"])):
        script, config = train_script.parse_arguments([*unit.settings["flags"], "--task", "rotten_tomatoes"])
        assert not config.dp and script.train_lora == (unit.settings["arm"] != "head")
