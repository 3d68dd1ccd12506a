"""The quick start's released task (examples/released/): what another organisation published, checked as a merger
would check it before merging: allow-listed files only, no path of the training machine, unseeded DP at ε = 8, the
adapter and its private head of one task at the same ε, both trained on the base the quick start builds."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hf_dpmerge.records.fingerprint import directory_fingerprint
from hf_dpmerge.records.record import PrivacyRecord
from hf_dpmerge.records.release_files import unlisted_files

REPO = Path(__file__).resolve().parents[2]
RELEASED = REPO / "examples" / "released"
FOLDERS = {"adapter": RELEASED / "runs" / "election_tweets" / "adapter",
           "encoder adapter": RELEASED / "runs" / "election_tweets" / "encoder_adapter",
           "private head": RELEASED / "runs_floor" / "election_tweets" / "adapter"}


def test_the_released_folders_hold_release_files_only_and_no_machine_path() -> None:
    for folder in FOLDERS.values():
        assert folder.is_dir() and unlisted_files(folder) == []
        for path in folder.iterdir():
            if path.suffix in (".json", ".md", ".py"):
                text = path.read_text()
                assert not any(root in text for root in ("/work/", "/tmp/", "/root/", "/home/")), path


def test_the_released_task_is_an_unseeded_private_adapter_and_its_private_head_at_the_same_epsilon() -> None:
    records = {name: PrivacyRecord.load(folder) for name, folder in FOLDERS.items()}
    for record in records.values():
        assert record.task == "election_tweets" and record.dp and not record.seeded
        assert math.isclose(record.epsilon, 8.0, rel_tol=0.01) and record.delta < 1e-4
    assert records["adapter"].extra["train_lora"] and not records["private head"].extra["train_lora"]
    assert records["encoder adapter"].to_dict() == records["adapter"].to_dict()


@pytest.mark.slow
def test_the_released_task_was_trained_on_the_base_the_quick_start_builds(tmp_path) -> None:
    """The packaged MiniLM saved as train_glue.py saves runs/base: every record's base fingerprint matches it."""
    from hf_dpmerge.scripts.train import ScriptArguments, shared_base

    base = shared_base(ScriptArguments(tasks="election_tweets", runs_dir=str(tmp_path / "runs")))
    for name, folder in FOLDERS.items():
        record = PrivacyRecord.load(folder)
        assert directory_fingerprint(base, record.base_model_hash_tensors) == record.base_model_hash, name
