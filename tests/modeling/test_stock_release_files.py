"""The files of a task adapter's release as training writes them (train_glue.py's runs layout): one file mode for
every file, and an ``adapter_config.json`` that lists each module once."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from hf_dpmerge.records.release_files import unlisted_files
from tests.utils.stock_loading import ADAPTER, release_task_adapter


@pytest.fixture
def umask_027():
    previous = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.parametrize("shared_encoder", [True, False], ids=["shared-encoder", "whole-base"])
def test_every_file_of_a_released_adapter_has_the_umask_mode(tmp_path, umask_027, shared_encoder):
    """Not safetensors' 0600 for the stock base's weights beside 0640 for the rest: one rule, open()'s mode."""
    release_task_adapter(tmp_path, shared_encoder=shared_encoder)
    adapter = tmp_path / ADAPTER
    modes = {p.relative_to(adapter).as_posix(): stat.S_IMODE(p.stat().st_mode)
             for p in adapter.rglob("*") if p.is_file()}
    assert any(name.endswith(".safetensors") and name != "adapter_model.safetensors" for name in modes), modes
    assert set(modes.values()) == {0o640}, modes
    assert not unlisted_files(adapter)  # the adapter folder, its own stock base, holds release files only


def test_adapter_config_lists_each_module_to_save_once(tmp_path):
    release_task_adapter(tmp_path)
    config = json.loads((Path(tmp_path) / ADAPTER / "adapter_config.json").read_text())
    assert config["modules_to_save"] and len(config["modules_to_save"]) == len(set(config["modules_to_save"]))
    assert "classifier" in config["modules_to_save"]
