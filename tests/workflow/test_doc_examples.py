"""Every Python block of README.md and docs/*.md runs as written, in a fresh interpreter, in a folder holding
what the block says it comes after (a block after the README's quick start finds a ``merged-hub/`` there, and one
after ``push --multi_adapter`` a ``multi-adapter-hub/``, built from tiny models: the block's code, not the models,
is under test)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import PeftModel

from hf_dpmerge.data.tasks import get_task_spec
from hf_dpmerge.modeling import load_sequence_classifier
from hf_dpmerge.training.lora_classifier import lora_sequence_classifier
from tests.utils.records import privacy_record
from tests.utils.tiny_models import tiny_bert, tiny_tokenizer

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks() -> list[tuple[str, str]]:
    """(``file:line``, code) of every fenced Python block."""
    blocks = []
    for path in DOCUMENTS:
        text = path.read_text()
        for match in BLOCK.finditer(text):
            blocks.append((f"{path.name}:{text[:match.start()].count(chr(10)) + 1}", match.group(1)))
    return blocks


def build_merged_hub(root: Path) -> None:
    """``runs/rotten_tomatoes/adapter/`` (a tiny adapter, its own stock base) and ``merged-hub/`` as
    ``hf-dpmerge push --dry-run`` stages it."""
    from hf_dpmerge.hub.push import push_merged_model
    from hf_dpmerge.modeling.stock_release import make_adapter_stock_loadable

    spec = get_task_spec("rotten_tomatoes")
    tiny_bert().save_pretrained(root / "tiny")
    shared = load_sequence_classifier(root / "tiny", classifier_pooling="mean")
    shared.save_pretrained(root / "base")
    tiny_tokenizer().save_pretrained(root / "base")
    adapter = root / "runs" / "rotten_tomatoes" / "adapter"
    model = lora_sequence_classifier(root / "base", spec, r=2, alpha=4, target_modules=["query", "value"])
    model.save_pretrained(adapter)
    privacy_record("rotten_tomatoes", seeded=False, extra={"label_names": list(spec.label_names)}).save(adapter)
    make_adapter_stock_loadable(adapter, root / "base", spec.label_names)
    base = load_sequence_classifier(root / "base", num_labels=2, ignore_mismatched_sizes=True)
    PeftModel.from_pretrained(base, adapter).merge_and_unload().save_pretrained(root / "merged")
    tiny_tokenizer().save_pretrained(root / "merged")
    (root / "merged" / "mergekit_config.yml").write_text("merge_method: dp_aware\n")
    push_merged_model(root / "merged", "alice/merged", adapters={"rotten_tomatoes": adapter}, dry_run=True,
                      staging_dir=root / "merged-hub")


def build_multi_adapter_hub(root: Path) -> None:
    """``runs/`` with a shared base and tiny rotten_tomatoes and election_tweets adapters (2 labels each) and
    ``multi-adapter-hub/`` as ``hf-dpmerge push --multi_adapter --dry-run`` stages it."""
    from hf_dpmerge.hub.multi_adapter import push_multi_adapter
    from tests.utils.stock_loading import release_task_adapter

    tasks = ("rotten_tomatoes", "election_tweets")
    for seed, task in enumerate(tasks, start=1):
        labels = get_task_spec(task).label_names
        release_task_adapter(root, task=task, labels=labels, seed=seed)
        privacy_record(task, extra={"label_names": list(labels)}).save(root / "runs" / task / "adapter")
    push_multi_adapter(root / "runs", "alice/adapters", dry_run=True, staging_dir=root / "multi-adapter-hub",
                       adapters={task: root / "runs" / task / "adapter" for task in tasks})


@pytest.mark.slow
@pytest.mark.parametrize(("where", "code"), python_blocks(), ids=[where for where, _ in python_blocks()])
def test_documented_python_runs_as_written(where: str, code: str, tmp_path: Path) -> None:
    if "merged-hub" in code or "runs/rotten_tomatoes/adapter" in code:
        torch.manual_seed(0)
        build_merged_hub(tmp_path)
    if "multi-adapter-hub" in code:
        build_multi_adapter_hub(tmp_path)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, f"{where}:\n{result.stderr[-3000:]}"


def test_the_documents_hold_python_blocks() -> None:
    """The extraction itself: the README's and the docs' blocks are found (a changed fence would silently test
    nothing): the README's workflow snippet and docs/privacy.md's training example at least."""
    where = [w for w, _ in python_blocks()]
    assert any(w.startswith("README.md:") for w in where)
    assert any(w.startswith("privacy.md:") for w in where)
