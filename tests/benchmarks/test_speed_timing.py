"""The timing scripts' one helper: arms interleaved round by round with medians, one process's wall time and
peak RSS, a trainer's median step after a warm-up."""

import json
import subprocess
import sys

import pytest

from benchmarks.speed import timing


def test_arms_alternate_round_by_round_and_report_their_medians(monkeypatch):
    calls = []

    def run(command, **kwargs):
        arm = command[command.index("--_arm") + 1]
        calls.append(arm)
        step = {"a": [1.0, 3.0, 2.0], "b": [5.0, 4.0, 6.0]}[arm][calls.count(arm) - 1]
        return subprocess.CompletedProcess(command, 0, stdout=f"log line\n{json.dumps({'step_s': step})}\n")

    monkeypatch.setattr(timing.subprocess, "run", run)
    assert timing.run_arms("benchmarks.speed.x", ["a", "b"], 3, ["--steps", "2"]) == {"a": {"step_s": 2.0},
                                                                                     "b": {"step_s": 5.0}}
    assert calls == ["a", "b"] * 3


def test_a_process_is_timed_and_a_failing_one_raises_with_its_error():
    wall, rss = timing.timed_process([sys.executable, "-c", "x = bytearray(50 * 2**20)"])
    assert wall > 0 and rss > 50
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        timing.timed_process([sys.executable, "-c", "1 / 0"])


def test_the_step_time_is_the_median_after_one_untimed_warm_up_step(monkeypatch):
    clock = iter([0.0, 10.0, 11.0, 20.0, 23.0, 30.0, 32.0])  # warm-up from 0: untimed; then 1, 3 and 2 s

    class Trainer:
        model = optimizer = type("Stub", (), {"zero_grad": lambda self: None, "step": lambda self: None})()

        def training_step(self, model, inputs):
            inputs.pop("x")  # a step may consume its inputs: each gets its own copy

    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    assert timing.median_step_seconds(Trainer(), {"x": 1}, 3) == 2.0
