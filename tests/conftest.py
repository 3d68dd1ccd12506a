"""Offline Hugging Face libraries for every test, and the fixtures the test packages share.

The builders live in ``tests/utils`` (subprocess helpers import them too); these fixtures hand them to tests:

- ``make_record``: a valid privacy record for a task, any field overridden (:func:`tests.utils.records.privacy_record`);
- ``lora_model``: a tiny peft model: ``"classifier"`` (BERT, LoRA on query/value, trained head; keyword arguments
  go to :func:`~tests.utils.training_helpers.lora_classifier`), ``"causal_lm"`` (GPT-2) or ``"dora"``;
- ``loopback_hub``: the loopback Hub as the Hub of the test (:func:`tests.utils.hub_helpers.serving_loopback_hub`);
- ``fake_runs``: one per test module: a ``runs/`` directory as the training example writes it, with a merged model
  and GLUE-shaped data (:func:`tests.utils.runs_builders.build_fake_runs`);
- ``merge_runs``: ``merge_runs(tasks)`` is a fresh ``runs/`` with a saved base and one LoRA adapter (and its
  encoder export) per task, ``tasks`` mapping each name to its number of labels
  (:func:`tests.utils.merging_builders.save_merge_runs`).
"""

import gc
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if workers := os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    # pytest -n N: the cores split among the workers (and the subprocesses they start), not oversubscribed
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // int(workers))))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move what collecting imported (torch, transformers, every test module) out of the garbage collector's reach:
    the stock Trainer runs ``gc.collect()`` after every training, whose cost grows with the tracked objects (about
    0.4 s each time with the collected suite's 700k, against microseconds once frozen)."""
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="session")
def make_record():
    from tests.utils.records import privacy_record

    return privacy_record


@pytest.fixture(scope="session")
def lora_model():
    from tests.utils.training_helpers import dora_classifier, lora_causal_lm, lora_classifier

    builders = {"classifier": lora_classifier, "causal_lm": lora_causal_lm, "dora": dora_classifier}

    def build(kind: str = "classifier", **kwargs):
        return builders[kind](**kwargs)

    return build


@pytest.fixture
def loopback_hub():
    from tests.utils.hub_helpers import serving_loopback_hub

    with serving_loopback_hub() as hub:
        yield hub


@pytest.fixture(scope="module")
def fake_runs(tmp_path_factory):
    from tests.utils.runs_builders import build_fake_runs

    return build_fake_runs(tmp_path_factory.mktemp("fake_runs"))


@pytest.fixture(scope="session")
def merge_runs(tmp_path_factory):
    from tests.utils.merging_builders import save_merge_runs

    def build(tasks: dict[str, int]):
        return save_merge_runs(tmp_path_factory.mktemp("merge") / "runs", tasks)

    return build
