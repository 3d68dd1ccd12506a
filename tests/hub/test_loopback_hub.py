"""The loopback-Hub fixture: every Hub client a test runs reaches it, and only the calls under test do."""

import os

from huggingface_hub import HfApi
from huggingface_hub.utils import _detect_agent


def test_the_loopback_hub_receives_the_client_calls_and_nothing_else(loopback_hub, monkeypatch, tmp_path):
    # as in a fresh process with no cached agent-harness registry: with telemetry on, the first request's
    # user agent would fetch GET {ENDPOINT}/api/agent-harnesses, which the loopback Hub does not serve
    monkeypatch.setattr(_detect_agent, "_registry", None)
    monkeypatch.setattr(_detect_agent.constants, "AGENT_HARNESSES_PATH", str(tmp_path / "agent_harnesses.json"))

    HfApi().create_repo("alice/probe", private=True)
    assert loopback_hub.requests == [("POST", "/api/repos/create")] and loopback_hub.unhandled == []
    assert loopback_hub.repos["alice/probe"].private and not loopback_hub.auth_failures
    assert os.environ["HF_ENDPOINT"] == loopback_hub.url  # subprocesses reach it too


def test_routes_the_loopback_hub_does_not_serve_are_404s_named_in_unhandled(loopback_hub):
    import requests

    response = requests.get(f"{loopback_hub.url}/api/spaces/alice/nothing", timeout=5)
    assert response.status_code == 404
    assert "not implemented by the loopback hub: GET /api/spaces/alice/nothing" in response.json()["error"]
    assert loopback_hub.unhandled == [("GET", "/api/spaces/alice/nothing")]
