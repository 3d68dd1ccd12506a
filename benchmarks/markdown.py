"""What every benchmark report writes its tables with (one home for the markdown helpers)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def table_lines(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A markdown table: the header row, the rule, one line per row."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows)]


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return "\n".join(table_lines(header, rows))


def mean_sd(values: Sequence[float], spec: str = ".1f") -> str:
    """``mean ± sd`` over seeds (the mean alone for one seed; – for none)."""
    if not values:
        return "–"
    text = format(statistics.fmean(values), spec)
    return text + (f" ± {format(statistics.stdev(values), spec)}" if len(values) > 1 else "")
