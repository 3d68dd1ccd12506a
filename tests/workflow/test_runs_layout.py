"""The runs layout has one reader: every command finds the same runs, and an adapter without its privacy record
is reported, not skipped."""

import json

import pytest

from hf_dpmerge.analysis.task_run import task_runs
from hf_dpmerge.records.record import PrivacyRecordError
from hf_dpmerge.records.run_folders import ADAPTER_DIR, run_adapters


def _adapter(runs, name, record=True):
    adapter = runs / name / ADAPTER_DIR
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    if record:
        (adapter / "dp_privacy.json").write_text("{}")
    return adapter


def test_runs_are_the_folders_whose_adapter_is_a_peft_adapter(tmp_path):
    beta, alpha = _adapter(tmp_path, "beta"), _adapter(tmp_path, "alpha", record=False)
    (tmp_path / "base").mkdir()
    (tmp_path / "notes" / ADAPTER_DIR).mkdir(parents=True)  # no adapter_config.json: not a run
    assert run_adapters(tmp_path) == {"alpha": alpha, "beta": beta}
    with pytest.raises(FileNotFoundError, match="does not exist; train adapters first, or pass --runs"):
        run_adapters(tmp_path / "missing")


def test_an_adapter_without_its_record_is_an_error_not_a_skipped_task(tmp_path):
    _adapter(tmp_path, "alpha", record=False)
    with pytest.raises(PrivacyRecordError, match="no privacy record at .*alpha"):
        task_runs(tmp_path)
