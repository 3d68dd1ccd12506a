"""Helpers of the hub tests: a loopback stand-in for the Hugging Face Hub (the endpoints ``create_repo``,
``repo_info`` and ``upload_folder`` call in huggingface_hub 2.4), recording everything it is sent.

``upload_folder`` validates README.md's metadata (``POST /api/validate-yaml``), asks ``preupload`` how to send each
file, then commits (ndjson: a header line, one line per file). This server answers ``uploadMode: regular``, so
contents travel base64-inline and no LFS/xet storage is needed (keep test files small); ``lfsFile`` lines are
refused. It binds 127.0.0.1 only, caps body size and request count, shuts down after ``lifetime_s``, and answers
any other route 404, listing it in ``unhandled``.

:func:`serving_loopback_hub` makes it the Hub of everything a test runs: huggingface_hub's ``ENDPOINT``,
transformers' shared ``HfApi``, ``HF_ENDPOINT`` for subprocesses, a dummy ``HF_TOKEN``, offline mode lifted, and
telemetry off (with it on, building the user agent fetches ``GET {ENDPOINT}/api/agent-harnesses`` once per process).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

MAX_BODY = 8 * 1024 * 1024
LOOPBACK_TOKEN = "hf_loopback_dummy_token"
MAX_REQUESTS = 200

_REPO = r"(?P<repo>[^/]+/[^/]+)"
_ROUTES = [
    ("POST", re.compile(r"^/api/repos/create$"), "create"),
    ("POST", re.compile(r"^/api/validate-yaml$"), "validate_yaml"),
    ("GET", re.compile(rf"^/api/models/{_REPO}(?:/revision/(?P<rev>[^/]+))?$"), "info"),
    ("POST", re.compile(rf"^/api/models/{_REPO}/preupload/(?P<rev>[^/]+)$"), "preupload"),
    ("POST", re.compile(rf"^/api/models/{_REPO}/commit/(?P<rev>[^/]+)$"), "commit"),
]


@dataclass
class FakeRepo:
    repo_id: str
    private: bool
    create_payload: dict[str, Any]
    files: dict[str, bytes] = field(default_factory=dict)
    commits: list[dict[str, Any]] = field(default_factory=list)

    @property
    def sha(self) -> str:
        return hashlib.sha1(str(len(self.commits)).encode() + self.repo_id.encode()).hexdigest()


class FakeHub:
    """Start with ``with FakeHub(token="hf_dummy") as hub:``; ``hub.url`` is the endpoint."""

    def __init__(self, token: str, lifetime_s: float = 120.0) -> None:
        self.token = token
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[tuple[str, str]] = []
        self.unhandled: list[tuple[str, str]] = []
        self.auth_failures: list[tuple[str, str]] = []
        self.validated_cards: list[str] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._watchdog = threading.Timer(lifetime_s, self._server.shutdown)
        self._watchdog.daemon = True

    def __enter__(self) -> FakeHub:
        self._thread.start()
        self._watchdog.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._watchdog.cancel()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def add_repo(self, repo_id: str, private: bool) -> FakeRepo:
        repo = FakeRepo(repo_id, private, create_payload={})
        self.repos[repo_id] = repo
        return repo

    # ------------------------------------------------------------------------------------------ handlers

    def _handle(self, method: str, path: str, headers: Any, body: bytes) -> tuple[int, dict[str, Any], dict]:
        with self._lock:
            self.requests.append((method, path))
            if len(self.requests) > MAX_REQUESTS:
                return 403, {"error": "too many requests for a test"}, {}
            matches = ((name, rx.match(path)) for verb, rx, name in _ROUTES if verb == method)
            route = next(((name, m) for name, m in matches if m), None)
            if route is None:
                self.unhandled.append((method, path))
                return 404, {"error": f"not implemented by the loopback hub: {method} {path}"}, {}
            if headers.get("Authorization") != f"Bearer {self.token}":
                self.auth_failures.append((method, path))
                return 401, {"error": "Invalid credentials in Authorization header"}, {}
            name, match = route
            return getattr(self, f"_{name}")(match, body)

    def _not_found(self, repo_id: str) -> tuple[int, dict, dict]:
        return 404, {"error": f"Repository {repo_id} not found"}, {"X-Error-Code": "RepoNotFound"}

    def _create(self, match: re.Match, body: bytes) -> tuple[int, dict, dict]:
        payload = json.loads(body)
        repo_id = f"{payload['organization']}/{payload['name']}" if payload.get("organization") else payload["name"]
        url = f"{self.url}/{repo_id}"
        if repo_id in self.repos:
            return 409, {"error": "You already created this model repo", "url": url}, {}
        private = payload.get("visibility") == "private" or payload.get("private") is True
        self.repos[repo_id] = FakeRepo(repo_id, private, create_payload=payload)
        return 200, {"url": url, "name": repo_id}, {}

    def _validate_yaml(self, match: re.Match, body: bytes) -> tuple[int, dict, dict]:
        """``upload_folder`` checks README.md's metadata first; reject what the Hub would reject outright."""
        import yaml

        content = json.loads(body)["content"]
        self.validated_cards.append(content)
        errors = []
        if not content.startswith("---\n") or "\n---\n" not in content[4:]:
            errors.append("README.md has no YAML metadata block")
        else:
            try:
                meta = yaml.safe_load(content[4:].split("\n---\n", 1)[0])
            except yaml.YAMLError as err:
                meta, errors = None, [f"metadata is not valid YAML: {err}"]
            if not errors and not isinstance(meta, dict):
                errors.append("metadata must be a mapping")
            elif not errors:
                tags = meta.get("tags", [])
                if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
                    errors.append('"tags" must be an array of strings')
                for key in ("license", "library_name"):
                    if key in meta and not isinstance(meta[key], str):
                        errors.append(f'"{key}" must be a string')
        if errors:
            return 400, {"errors": [{"message": e} for e in errors], "warnings": []}, {}
        return 200, {"errors": [], "warnings": []}, {}

    def _info(self, match: re.Match, body: bytes) -> tuple[int, dict, dict]:
        repo = self.repos.get(match["repo"])
        if repo is None:
            return self._not_found(match["repo"])
        siblings = [{"rfilename": p} for p in sorted(repo.files)]
        return 200, {"id": repo.repo_id, "private": repo.private, "sha": repo.sha, "siblings": siblings}, {}

    def _preupload(self, match: re.Match, body: bytes) -> tuple[int, dict, dict]:
        if match["repo"] not in self.repos:
            return self._not_found(match["repo"])
        files = json.loads(body)["files"]
        return 200, {
            "files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None} for f in files]
        }, {}

    def _commit(self, match: re.Match, body: bytes) -> tuple[int, dict, dict]:
        repo = self.repos.get(match["repo"])
        if repo is None:
            return self._not_found(match["repo"])
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            return 400, {"error": "commit payload must start with a header line"}, {}
        added: dict[str, bytes] = {}
        for line in lines[1:]:
            if line["key"] != "file":
                return 422, {"error": f"loopback hub accepts inline files only, got {line['key']}"}, {}
            value = line["value"]
            if value.get("encoding") != "base64":
                return 422, {"error": "expected base64 content"}, {}
            added[value["path"]] = base64.b64decode(value["content"])
        repo.files.update(added)
        repo.commits.append({**lines[0]["value"], "revision": match["rev"], "files": sorted(added)})
        return 200, {"commitUrl": f"{self.url}/{repo.repo_id}/commit/{repo.sha}", "commitOid": repo.sha,
                     "pullRequestUrl": None}, {}

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    status, payload, extra = 413, {"error": "request body too large for the loopback hub"}, {}
                else:
                    body = self.rfile.read(length) if length else b""
                    path = self.path.split("?", 1)[0]
                    try:
                        status, payload, extra = hub._handle(self.command, path, self.headers, body)
                    except Exception as err:  # a bug in the fake fails the request (4xx: no retries)
                        status, payload, extra = 400, {"error": f"loopback hub error: {err!r}"}, {}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in extra.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _serve

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


@contextmanager
def serving_loopback_hub(token: str = LOOPBACK_TOKEN) -> Iterator[FakeHub]:
    """A :class:`FakeHub` as the Hub of this process and its subprocesses (see the module docstring) until exit."""
    from huggingface_hub import constants
    from transformers.utils import hub as transformers_hub

    with FakeHub(token=token) as server, pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_ENDPOINT", server.url)
        patch.setenv("HF_TOKEN", token)
        patch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        patch.setattr(constants, "ENDPOINT", server.url)
        patch.setattr(constants, "HF_HUB_OFFLINE", False)
        patch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
        patch.setattr(transformers_hub, "_hf_api", None)
        yield server


def write_hub_cache(cache: os.PathLike, repo_id: str, files: dict[str, bytes]) -> Path:
    """``files`` (repository path → content) as a download leaves them in the huggingface_hub cache ``cache``
    (``models--<owner>--<name>/snapshots/<commit>``, ``refs/main`` naming the commit); the snapshot folder."""
    commit = "0" * 40
    repo = Path(cache) / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    for name, content in files.items():
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).write_bytes(content)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot
