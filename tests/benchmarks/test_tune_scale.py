"""benchmarks/tune_scale.py: the shipped configs' ./runs/ paths are moved to the runs folder being tuned."""

from __future__ import annotations

from pathlib import Path

from benchmarks.tune_scale import CONFIGS, at_runs
from hf_dpmerge.merging.config_edit import read_merge_config, with_parameter


def test_every_tuned_config_points_at_the_given_runs_and_keeps_its_other_settings(tmp_path: Path) -> None:
    runs = tmp_path / "elsewhere" / "runs"
    for path in CONFIGS:
        config = read_merge_config(path)
        moved = with_parameter(at_runs(config, runs), "lambda", 0.7)
        assert moved["base_model"] == f"{runs}/base"
        for original, entry in zip(config["models"], moved["models"], strict=True):
            base, adapter = entry["model"].split("+")
            assert base == f"{runs}/base"
            assert adapter == original["model"].split("+")[1].replace("./runs/", f"{runs}/")
            assert entry.get("parameters") == original.get("parameters")
        assert moved["parameters"] == {**config["parameters"], "lambda": 0.7}
        assert config["base_model"] == "./runs/base"  # the loaded config is left as it was
