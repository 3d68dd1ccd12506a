"""Seeds of a run's random streams (Poisson sampling, Gaussian noise): one stream per run, never shared.

Without ``dp_seed`` each stream is seeded from OS entropy. With ``dp_seed`` the seed of stream ``s`` is

    seed_s = first 63 bits of SHA-256(dp_seed, run identity, s)

where the run identity is the training dataset's identity: its ``datasets`` ``_fingerprint`` (which changes
with the data files and every transform applied), else a SHA-256 of its rows. So one ``dp_seed`` on two datasets
(two tasks of a benchmark) draws independent masks and noise — parallel composition and the dp_aware merge's
independent-noise model hold — while one ``dp_seed`` on one dataset reproduces every draw. A seeded run is
still not private against whoever holds the seed and the data's identity: both are enough to regenerate
and subtract the noise (docs/design.md §10; the record's ``seeded`` field says so).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

import datasets
import numpy as np
import torch

SAMPLING_STREAM = "poisson_sampling"
NOISE_STREAM = "gaussian_noise"


def _update_with(digest: Any, value: Any) -> None:
    if isinstance(value, Mapping):
        for key in sorted(value):
            digest.update(str(key).encode())
            _update_with(digest, value[key])
    elif isinstance(value, (list, tuple)):
        digest.update(f"[{len(value)}".encode())
        for item in value:
            _update_with(digest, item)
    elif isinstance(value, torch.Tensor):
        digest.update(str(value.dtype).encode() + str(tuple(value.shape)).encode())
        digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    elif isinstance(value, np.ndarray):
        digest.update(str(value.dtype).encode() + str(value.shape).encode() + value.tobytes())
    else:
        digest.update(repr(value).encode())


def dataset_identity(dataset: Any) -> str:
    """The ``datasets`` fingerprint of ``dataset``, or a SHA-256 over its rows (a map-style torch dataset)."""
    if isinstance(dataset, datasets.Dataset):
        return f"datasets:{dataset._fingerprint}"
    digest = hashlib.sha256()
    for index in range(len(dataset)):
        _update_with(digest, dataset[index])
    return f"sha256:{digest.hexdigest()}"


def entropy_seed() -> int:
    """A seed of 63 bits from ``os.urandom`` (a stream of a run without ``dp_seed``)."""
    return int.from_bytes(os.urandom(8), "little") >> 1


def stream_seed(dp_seed: int, identity: str, stream: str) -> int:
    """The seed of ``stream`` for a run seeded with ``dp_seed`` whose data has ``identity``."""
    digest = hashlib.sha256(f"{dp_seed}|{identity}|{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
