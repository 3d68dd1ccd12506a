import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def loopback_hub(monkeypatch):
    """The loopback Hub (:class:`tests.utils.hub_helpers.FakeHub`) as the endpoint of huggingface_hub, of
    transformers' shared HfApi and of ``HF_ENDPOINT`` subprocess users, with a dummy token and offline mode lifted."""
    from huggingface_hub import constants
    from transformers.utils import hub as transformers_hub

    from tests.utils.hub_helpers import LOOPBACK_TOKEN, FakeHub

    with FakeHub(token=LOOPBACK_TOKEN) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_TOKEN", LOOPBACK_TOKEN)
        monkeypatch.setattr(constants, "ENDPOINT", server.url)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(transformers_hub, "_hf_api", None)
        yield server
