"""The one benchmark harness: a store that reuses a unit only when schema and settings match, a main that runs
what is missing and writes the report from every stored unit; the data-size study's plan and report on it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from benchmarks import harness
from benchmarks.harness import Store, Unit
from benchmarks.studies.data_size import DataSize


class Squares(harness.Study, name="squares", schema=1):
    """A toy study: one unit per x, its result x²; counts the units it runs; exports the sum."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--xs", default="1,2,3")
        parser.add_argument("--offset", type=int, default=0)

    def plan(self, args: argparse.Namespace) -> list[Unit]:
        if "0" in args.xs.split(","):
            raise ValueError("--xs: 0 is no unit")
        return [Unit(f"x{x}", {"x": int(x), "offset": args.offset}) for x in args.xs.split(",")]

    def run(self, unit: Unit, work_dir: Path) -> dict[str, Any]:
        self.ran.append(unit.name)
        return {"value": unit.settings["x"] ** 2 + unit.settings["offset"], "scratch": str(work_dir / unit.name)}

    def report(self, stored: list[dict[str, Any]]) -> dict[str, str]:
        return {"SQUARES.md": "\n".join(f"{unit['name']}: {unit['result']['value']}" for unit in stored) + "\n"}

    def exports(self, stored: list[dict[str, Any]]) -> dict[str, str]:
        return {"hf_dpmerge/squares.txt": str(sum(unit["result"]["value"] for unit in stored))}


def test_a_unit_is_reused_only_while_its_schema_and_settings_match(tmp_path: Path) -> None:
    store = Store(tmp_path, schema=2)
    unit = Unit("a", {"lr": 0.1})
    store.save(unit, {"score": 1.0})
    assert store.load(unit) == {"score": 1.0}
    assert store.load(Unit("a", {"lr": 0.2})) is None
    assert Store(tmp_path, schema=3).load(unit) is None and Store(tmp_path, schema=3).results() == []


def test_main_runs_what_is_missing_and_reports_every_stored_unit(tmp_path: Path, capsys) -> None:
    paths = ["--units-dir", str(tmp_path / "units"), "--out", str(tmp_path), "--work-dir", str(tmp_path / "work")]
    report = tmp_path / "benchmarks" / "reports" / "squares" / "SQUARES.md"
    study = Squares()
    assert harness.main(study, [*paths, "--xs", "1,2"], log=lambda _: None) == 0
    assert study.ran == ["x1", "x2"] and report.read_text() == "x1: 1\nx2: 4\n"
    assert (tmp_path / "hf_dpmerge" / "squares.txt").read_text() == "5"  # the export, written with the report
    assert Store(tmp_path / "units", 1).results()[0]["result"]["scratch"] == "<work>/x1"  # no local path
    harness.main(study, [*paths, "--xs", "1,2,3"], log=lambda _: None)
    assert study.ran == ["x1", "x2", "x3"]  # x1, x2 reused
    harness.main(study, [*paths, "--xs", "1", "--offset", "5"], log=lambda _: None)
    assert study.ran[-1] == "x1" and "x1: 6" in report.read_text()  # a changed setting reruns
    capsys.readouterr()
    harness.main(study, [*paths, "--xs", "1,4", "--offset", "5", "--plan"])
    assert capsys.readouterr().out.split("\n")[:2] == ["done  x1", "todo  x4"]
    harness.main(study, [*paths, "--report-only"], log=lambda _: None)
    assert len(study.ran) == 4
    with pytest.raises(SystemExit):  # a plan's ValueError is a usage error
        harness.main(study, [*paths, "--xs", "0"])



class Reruns(Squares, name="reruns", schema=1):
    """Squares whose plan asks every unit of ``--rerun`` to run again, stored or not."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--rerun", default="")

    def plan(self, args: argparse.Namespace) -> list[Unit]:
        return [Unit(u.name, u.settings, rerun=u.name in args.rerun.split(",")) for u in super().plan(args)]


def test_a_unit_the_plan_marks_rerun_runs_again_though_stored(tmp_path: Path, capsys) -> None:
    paths = ["--units-dir", str(tmp_path / "units"), "--out", str(tmp_path), "--work-dir", str(tmp_path / "work")]
    study = Reruns()
    harness.main(study, [*paths, "--xs", "1,2"], log=lambda _: None)
    capsys.readouterr()
    harness.main(study, [*paths, "--xs", "1,2", "--rerun", "x2", "--plan"])
    assert capsys.readouterr().out.split("\n")[:2] == ["done  x1", "todo  x2"]
    harness.main(study, [*paths, "--xs", "1,2", "--rerun", "x2"], log=lambda _: None)
    assert study.ran == ["x1", "x2", "x2"]

def test_the_data_size_report_pairs_seeds_and_corrects_over_its_rows(tmp_path: Path) -> None:
    study = DataSize()
    parser = argparse.ArgumentParser()
    study.add_arguments(parser)
    plan = study.plan(parser.parse_args(["--tasks", "rotten_tomatoes", "--sizes", "0,100,99999", "--seeds", "0,1,2"]))
    assert [u.settings["n"] for u in plan] == [100] * 9 + [0] * 3  # cheapest first; 99999 is the whole split
    assert {u.settings["arm"] for u in plan[9:]} == {"nonprivate_head"}  # the rest of N = all: the lpft study's
    stored = []
    for unit in plan:
        s = unit.settings
        test = {"adapter": 0.80, "private_head": 0.78, "nonprivate_head": 0.85}[s["arm"]] + 0.001 * s["seed"] ** 2
        stored.append({"name": unit.name, "settings": s,
                       "result": {"test": test - (0.002 * s["seed"] if s["arm"] == "private_head" else 0),
                                  "rows": s["n"] or 900, "train_seconds": 60.0}})
    text = study.report(stored)["REPORT.md"]
    row = next(line for line in text.splitlines() if line.startswith("| rotten_tomatoes | 100 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4:7] == ["80.2 ± 0.2", "78.0 ± 0.1", "85.2 ± 0.2"]
    assert cells[7] == "+2.20"  # 2.0, 2.2, 2.4 points over seeds 0, 1, 2
    assert float(cells[8]) < 0.05 and cells[9] != "–"


def test_the_epsilon_each_n_needs_is_read_off_the_tables_differences_and_holm() -> None:
    """On an ε grid the adapter trails at ε = 8, leads by a noisy margin at 16 and clearly at 32: ahead from 16,
    significantly (Holm over the table's rows) from 32."""
    study = DataSize()
    parser = argparse.ArgumentParser()
    study.add_arguments(parser)
    plan = study.plan(parser.parse_args(["--tasks", "rotten_tomatoes", "--sizes", "300", "--seeds", "0,1,2",
                                         "--epsilons", "8,16,32", "--arms", "adapter,private_head"]))
    lead = {8.0: (-0.010, -0.011, -0.012), 16.0: (0.020, -0.015, 0.010), 32.0: (0.030, 0.031, 0.032)}
    stored = [{"name": u.name, "settings": u.settings,
               "result": {"test": 0.70 + (lead[u.settings["epsilon"]][u.settings["seed"]]
                                          if u.settings["arm"] == "adapter" else 0.0),
                          "rows": 300, "train_seconds": 60.0}} for u in plan]
    text = study.report(stored)["REPORT.md"]
    assert ("- rotten_tomatoes, N = 300: adapter − head -1.10 at ε = 8, +0.50 at ε = 16, +3.10 at ε = 32 points; "
            "the mean is ahead from ε = 16, significantly (Holm) from ε = 32") in text
