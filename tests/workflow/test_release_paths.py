"""No path of the training machine leaves it: the adapter folder train_glue releases and the folder
`hf-dpmerge push --dry-run` stages (README, records, configs, tokenizer files, weights) name the base by Hub id
or by a path relative to the release, never by the runs directory, the temporary directory, the model's path
or the home directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf_dpmerge.cli.main import main as cli_main
from hf_dpmerge.hub.push import push_merged_model
from hf_dpmerge.scripts import train as train_glue
from hf_dpmerge.utils.adapter_files import ADAPTER_BASE_DIR
from tests.utils.merging_builders import lora_config_yaml
from tests.utils.tiny_models import save_tiny_bert
from tests.workflow.test_train_glue_release import TINY_RUN

pytestmark = pytest.mark.slow  # trains, merges and stages a tiny model


def files_naming(root: Path, needles: set[str]) -> dict[str, list[str]]:
    """Every file under ``root`` whose bytes hold one of ``needles``, with the needles found."""
    found = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        content = path.read_bytes()
        if hits := sorted(n for n in needles if n.encode() in content):
            found[str(path.relative_to(root))] = hits
    return found


def test_released_and_staged_files_hold_no_local_path(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # relative --runs_dir and merge config, as in the README
    model = save_tiny_bert(tmp_path / "tiny")
    train_glue.main(["--model_name_or_path", str(model), "--runs_dir", "runs", "--task", "bbc_news", *TINY_RUN])
    adapter = tmp_path / "runs" / "bbc_news" / "adapter"
    (tmp_path / "merge.yaml").write_text(
        lora_config_yaml("task_arithmetic", "./runs/base", ["./runs/bbc_news/encoder_adapter"],
                         per_model="    parameters: {weight: 1.0}\n"))
    assert cli_main(["merge", "merge.yaml", "merged", "--lora-merge-cache", "cache", "--quiet"]) == 0
    staged = push_merged_model("merged", "alice/m", adapters={"bbc_news": adapter}, dry_run=True).staging_dir

    needles = {str(tmp_path), str(tmp_path.resolve()), str((tmp_path / "runs").resolve()), str(model.resolve()),
               str(Path.home())}
    assert files_naming(adapter, needles) == {}
    assert files_naming(tmp_path / "merged" / "bbc_news", needles) == {}  # hf-dpmerge merge's task folder
    assert files_naming(staged, needles) == {}
    assert len(list(staged.rglob("*"))) > 5 and (staged / "bbc_news" / "dp_privacy.json").is_file()
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == ADAPTER_BASE_DIR
    assert json.loads((adapter / "dp_privacy.json").read_text())["base_model"] is None  # a local base: no Hub id
