"""The quality benchmark's results: one JSON per finished unit, reused while its settings are unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hf_dpmerge.utils.io import write_text_atomic

from .grid import Cell


class Store:
    """One JSON per finished unit under ``<work-dir>/results/<cell>/``; a unit is done when its settings match."""

    def __init__(self, work_dir: Path):
        self.root = work_dir / "results"

    def path(self, cell: Cell, unit: str) -> Path:
        return self.root / cell.name / f"{unit}.json"

    def load(self, cell: Cell, unit: str, settings: dict[str, Any]) -> dict[str, Any] | None:
        """The unit's result, or None when it is missing or was made with other settings."""
        path = self.path(cell, unit)
        if not path.is_file():
            return None
        result = json.loads(path.read_text())
        return result if result["settings"] == _jsonable(settings) else None

    def save(self, cell: Cell, unit: str, settings: dict[str, Any], payload: dict[str, Any]) -> None:
        """Write the unit's result atomically (temporary file, then rename)."""
        result = {"settings": _jsonable(settings), **payload}
        write_text_atomic(self.path(cell, unit), json.dumps(result, indent=1, allow_nan=True) + "\n")


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, allow_nan=True))
