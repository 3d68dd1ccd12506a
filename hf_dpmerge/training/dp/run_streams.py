"""Seeds of a run's random streams (Poisson sampling, Gaussian noise): one stream per run, never shared.

Without ``dp_seed`` each stream is seeded from OS entropy. With ``dp_seed`` the seed of stream ``s`` is

    seed_s = first 63 bits of SHA-256(dp_seed, run identity, s)

where the run identity is the training dataset's identity: a SHA-256 of its content (every row, columns by
name: a task's tokenized texts and labels), never of paths or of the ``datasets`` ``_fingerprint`` (which
hashes the tokenizer object, and so the folder it was loaded from). So one ``dp_seed`` on two datasets (two
tasks of a benchmark) draws independent masks and noise — parallel composition and the dp_aware merge's
independent-noise model hold — while one ``dp_seed`` on the same data reproduces every draw, wherever the
data and tokenizer were saved. A seeded run is
still not private against whoever holds the seed and the data's identity: both are enough to regenerate
and subtract the noise (docs/design.md §10; the record's ``seeded`` field says so).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

import datasets
import numpy as np
import torch

SAMPLING_STREAM = "poisson_sampling"
NOISE_STREAM = "gaussian_noise"


SCALARS = (bool, int, float, str, bytes, type(None))
ROW_BATCH = 1024


def _update_with(digest: Any, value: Any) -> None:
    if isinstance(value, Mapping):
        digest.update(f"{{{len(value)}".encode())
        for key in sorted(value):
            digest.update(repr(str(key)).encode())
            _update_with(digest, value[key])
    elif isinstance(value, (list, tuple)) and all(isinstance(item, SCALARS) for item in value):
        digest.update(repr(list(value)).encode())
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


def _rows(dataset: Any) -> Iterator[Any]:
    """The rows of a ``datasets.Dataset`` (as plain Python values, whatever its format) or a map-style dataset."""
    if isinstance(dataset, datasets.Dataset):
        for batch in dataset.with_format(None).iter(batch_size=ROW_BATCH):
            columns = sorted(batch)
            yield from (dict(zip(columns, values, strict=True)) for values in zip(*(batch[c] for c in columns)))
    else:
        yield from (dataset[index] for index in range(len(dataset)))


def dataset_identity(dataset: Any) -> str:
    """SHA-256 over the rows of ``dataset`` (content only: the same data gives the same identity from any path)."""
    digest = hashlib.sha256()
    for row in _rows(dataset):
        _update_with(digest, row)
    return f"sha256:{digest.hexdigest()}"


def entropy_seed() -> int:
    """A seed of 63 bits from ``os.urandom`` (a stream of a run without ``dp_seed``)."""
    return int.from_bytes(os.urandom(8), "little") >> 1


def stream_seed(dp_seed: int, identity: str, stream: str) -> int:
    """The seed of ``stream`` for a run seeded with ``dp_seed`` whose data has ``identity``."""
    digest = hashlib.sha256(f"{dp_seed}|{identity}|{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
