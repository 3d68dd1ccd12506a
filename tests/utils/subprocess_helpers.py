"""Running the project's commands in subprocesses, offline, as a user would."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def run_offline(cmd: list[str], cwd: Path, timeout: int = 600, **extra_env: str) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` with the Hub switched off (and ``extra_env`` set); fail the test with its output when it
    exits non-zero."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **extra_env}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


REPO = Path(__file__).resolve().parents[2]
