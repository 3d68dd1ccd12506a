"""What ``hf-dpmerge evaluate`` reports and writes (``results.json``, ``retention.png``): per task, the floor
(:data:`FLOOR_KINDS`), the individual adapter and the merged model's scores (:mod:`hf_dpmerge.analysis.evaluation`)
and what is derived from them:

    gain retained = (merged − floor) / (individual − floor)   ("below floor" where individual ≤ floor)
    retention = merged / individual,   interference = individual − merged   (points of the primary metric)

Retention is read beside the floor only; interference is the whole drop from the task's own model to the merge
(the merge method's own shrinkage included). :meth:`EvaluationReport.definitions` is the one legend of the
table, ``results.json`` and the merged card. Averages are unweighted over tasks. See docs/design.md §11.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# retention and interference by the shipped merge_retention evaluate module's kernel: evaluate.load gives the same
from hf_dpmerge.data.metrics import gain_retained, retention_and_interference

RESULTS_NAME = "results.json"
CHART_NAME = "retention.png"
OWN_HEAD_FLOOR, PRIVATE_HEAD_FLOOR = "own_head", "private_head"
FLOOR_KINDS = {
    OWN_HEAD_FLOOR: "the unmodified base encoder with the task's own head (no adapter, no merge)",
    PRIVATE_HEAD_FLOOR: "the private head: the unmodified base encoder with a head trained by its own recipe "
                        "(--train_lora false) at the same ε on the same data (hf-dpmerge evaluate --floor_runs)",
}
COLUMN_LABELS = {"metric": "metric", "epsilon": "ε", "floor": "floor", "individual": "individual",
                 "merged": "merged", "gain_retained": "gain retained", "retention": "retention",
                 "interference": "interference", "own_head": "own head", "num_examples": "examples"}
"""The report's columns in order: ``results.json``'s row key → the label of evaluate's table and of the card."""


@dataclass
class TaskEvaluation:
    """One task's scores (its primary ``metric``) for its own adapter, the merged model and the floor (None in
    results written before the floor was scored)."""

    task: str
    metric: str
    epsilon: float
    delta: float | None
    individual: float
    merged: float
    num_examples: int
    individual_metrics: dict[str, float] = field(default_factory=dict)
    merged_metrics: dict[str, float] = field(default_factory=dict)
    floor: float | None = None
    floor_metrics: dict[str, float] = field(default_factory=dict)
    own_head: float | None = None  # the base encoder with the adapter's own head, when the floor is a private head

    @property
    def below_floor(self) -> bool:
        """The adapter does not beat the base encoder with its own head: there is no gain to retain."""
        return self.floor is not None and self.individual <= self.floor

    @property
    def gain_retained(self) -> float:
        """(merged − floor) / (individual − floor); NaN below the floor or without a floor."""
        gain = None if self.floor is None else gain_retained(self.merged, self.individual, self.floor)
        return math.nan if gain is None else gain

    @property
    def retention(self) -> float:
        """merged / individual; NaN when individual ≤ 0 (the ratio means nothing there)."""
        return retention_and_interference(self.individual, self.merged)["retention"]

    @property
    def interference(self) -> float:
        """individual − merged: the drop the merge causes on this task (positive = worse)."""
        return retention_and_interference(self.individual, self.merged)["interference"]


def mean_of_defined(values: list[float | None]) -> float | None:
    """The mean of the values that are neither None nor NaN (None when there are none): a report's average."""
    values = [v for v in values if _defined(v)]
    return float(np.mean(values)) if values else None


@dataclass
class EvaluationReport:
    """Per-task evaluations plus what was evaluated; averages are unweighted over tasks."""

    tasks: list[TaskEvaluation]
    merged_model: str
    base_model: str
    max_eval_samples: int | None = None
    split: str = "test"
    floor_kind: str = OWN_HEAD_FLOOR

    def averages(self) -> dict[str, float | None]:
        mean = mean_of_defined
        individual, merged = mean([t.individual for t in self.tasks]), mean([t.merged for t in self.tasks])
        floor = mean([t.floor for t in self.tasks]) if all(t.floor is not None for t in self.tasks) else None
        # the formula on the averaged scores: a mean of per-task ratios explodes where an adapter barely beats
        # its floor
        gain = None if None in (floor, individual, merged) else gain_retained(merged, individual, floor)
        return {
            "floor": floor,
            "own_head": mean([t.own_head for t in self.tasks]),
            "individual": individual,
            "merged": merged,
            "gain_retained": gain,
            "below_floor": None if floor is None or individual is None else individual <= floor,
            "retention": mean([t.retention for t in self.tasks]),
            "interference": mean([t.interference for t in self.tasks]),
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON shape: ``tasks`` (one row per task), ``average``, full ``metrics``, scalars."""
        return {
            "tasks": {
                t.task: {
                    "metric": t.metric,
                    "epsilon": t.epsilon,
                    "floor": t.floor,
                    "own_head": t.own_head,
                    "individual": t.individual,
                    "merged": t.merged,
                    "gain_retained": t.gain_retained if _defined(t.gain_retained) else None,
                    "below_floor": t.below_floor,
                    "retention": t.retention if _defined(t.retention) else None,
                    "interference": t.interference,
                    "num_examples": t.num_examples,
                }
                for t in self.tasks
            },
            "average": self.averages(),
            "metrics": {t.task: {"floor": t.floor_metrics, "individual": t.individual_metrics,
                                 "merged": t.merged_metrics} for t in self.tasks},
            "deltas": {t.task: t.delta for t in self.tasks},
            "max_epsilon": max((t.epsilon for t in self.tasks), default=None),
            "merged_model": self.merged_model,
            "base_model": self.base_model,
            "max_eval_samples": self.max_eval_samples,
            "split": self.split,
            "floor_kind": self.floor_kind,
            "definitions": self.definitions(),
        }

    @property
    def has_own_head(self) -> bool:
        """Whether the adapters' own heads were scored apart from the floor (it is the private head)."""
        return any(t.own_head is not None for t in self.tasks)

    def definitions(self) -> dict[str, str]:
        """What each column shows, keyed as in :data:`COLUMN_LABELS` (``own_head`` only when scored): the one
        source of evaluate's legend, ``results.json``'s ``definitions`` and a merged model's card."""
        text = {
            "metric": "the task's primary metric, the one every score column is in",
            "epsilon": "the recorded ε of the task's adapter (∞: non-private)",
            "floor": FLOOR_KINDS[self.floor_kind],
            "individual": "the unmodified base encoder with the task's adapter (LoRA + its own head): what the "
                          "multi-adapter release (hf-dpmerge push --multi_adapter) computes, the lossless ceiling of "
                          "a merge",
            "merged": "the merged encoder with the task's own head",
            "gain_retained": "(merged − floor) / (individual − floor); \"below floor\" (null in results.json) where "
                             "individual ≤ floor; the average is the formula on the averaged scores",
            "retention": "merged / individual (undefined where individual ≤ 0); read it beside the floor",
            "interference": "individual − merged (positive: the merge is worse on the task)",
            "own_head": FLOOR_KINDS[OWN_HEAD_FLOOR],
            "num_examples": f"how many examples of the task's {self.split} split were scored",
        }
        return {key: text[key] for key in COLUMN_LABELS if key != "own_head" or self.has_own_head}

    @classmethod
    def from_dict(cls, data: Any, source: str = "evaluation results") -> EvaluationReport:
        """The report :meth:`to_dict` wrote (gain retained, retention and interference are recomputed from the
        scores; results without a floor read as floor None)."""
        try:
            metrics, deltas = data.get("metrics") or {}, data.get("deltas") or {}
            floor_kind = data.get("floor_kind", OWN_HEAD_FLOOR)
            if floor_kind not in FLOOR_KINDS:
                raise ValueError(f"floor_kind {floor_kind!r} is none of {sorted(FLOOR_KINDS)}")
            tasks = [
                TaskEvaluation(
                    task=str(task), metric=str(row["metric"]), epsilon=float(row["epsilon"]),
                    delta=None if deltas.get(task) is None else float(deltas[task]),
                    individual=float(row["individual"]), merged=float(row["merged"]),
                    num_examples=int(row["num_examples"]),
                    individual_metrics=dict((metrics.get(task) or {}).get("individual") or {}),
                    merged_metrics=dict((metrics.get(task) or {}).get("merged") or {}),
                    floor=None if row.get("floor") is None else float(row["floor"]),
                    floor_metrics=dict((metrics.get(task) or {}).get("floor") or {}),
                    own_head=None if row.get("own_head") is None else float(row["own_head"]),
                )
                for task, row in data["tasks"].items()
            ]
            return cls(tasks=tasks, merged_model=str(data["merged_model"]), base_model=str(data["base_model"]),
                       max_eval_samples=data.get("max_eval_samples"), split=str(data.get("split", "test")),
                       floor_kind=floor_kind)
        except (AttributeError, KeyError, TypeError, ValueError) as err:
            raise ValueError(
                f"{source} is not what `hf-dpmerge evaluate` writes ({type(err).__name__}: {err})"
            ) from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> EvaluationReport:
        """Read ``results.json``, with errors naming the file."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"evaluation file {path} does not exist")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: corrupt evaluation JSON ({err})") from None
        return cls.from_dict(data, str(path))

    def save(self, directory: str | os.PathLike) -> tuple[Path, Path]:
        """Write ``results.json`` and ``retention.png`` into ``directory``; return both paths."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        json_path = directory / RESULTS_NAME
        json_path.write_text(json.dumps(self.to_dict(), indent=2, allow_nan=True) + "\n")
        return json_path, plot_retention(self, directory / CHART_NAME)

    def table(self) -> str:
        """A plain-text table of every task and the averages (retention only beside the floor; an ``own head``
        column when the floor is the private head), then the legend: :meth:`definitions`."""
        own = self.has_own_head
        lines = [_row("task", "metric", "ε", "floor", "individual", "merged", "gain retained", "retention",
                      "interference", "own head" if own else None, "examples")]
        lines.append("-" * len(lines[0]))
        for t in self.tasks:
            eps = "∞" if math.isinf(t.epsilon) else f"{t.epsilon:.2f}"
            lines.append(_row(t.task, t.metric, eps, t.floor, t.individual, t.merged, _gain(t.gain_retained,
                              t.below_floor), t.retention, t.interference, _own(t.own_head) if own else None,
                              str(t.num_examples)))
        avg = self.averages()
        lines.append(_row("average", "", "", avg["floor"], avg["individual"], avg["merged"],
                          _gain(avg["gain_retained"], bool(avg["below_floor"])), avg["retention"],
                          avg["interference"], _own(avg["own_head"]) if own else None, ""))
        lines += [f"{COLUMN_LABELS[key]}: {text}" for key, text in self.definitions().items()]
        return "\n".join(lines)


def _own(value: float | None) -> float | str:
    return "–" if value is None else value


def _defined(value: float | None) -> bool:
    return value is not None and not math.isnan(value)


def _gain(gain: float | None, below_floor: bool) -> str | float | None:
    """``below floor`` where the adapter does not beat its floor, else the gain (– when unmeasured)."""
    return "below floor" if below_floor else gain


def _row(task: str, metric: str, eps: str, floor, individual, merged, gain, retention, interference,
         own_head=None, examples: str = "") -> str:
    def num(x, spec: str) -> str:
        return x if isinstance(x, str) else (format(x, spec) if _defined(x) else "–")

    cells = (num(floor, ".4f"), num(individual, ".4f"), num(merged, ".4f"), num(gain, ".1%"), num(retention, ".1%"),
             num(interference, "+.4f"))
    row = (f"{task:<18} {metric:<21} {eps:>6} {cells[0]:>8} {cells[1]:>10} {cells[2]:>8} {cells[3]:>13} "
           f"{cells[4]:>9} {cells[5]:>12}")
    row = row if own_head is None else f"{row} {num(own_head, '.4f'):>9}"
    return f"{row} {examples:>8}".rstrip()


def plot_retention(report: EvaluationReport, path: str | os.PathLike) -> Path:
    """Grouped bars (floor, individual and merged per task, plus the average), gain retained written above each
    group ("below floor" where the adapter does not beat its floor)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    avg = report.averages()
    labels = [f"{t.task}\nε={'∞' if math.isinf(t.epsilon) else f'{t.epsilon:g}'}" for t in report.tasks]
    floor = [math.nan if t.floor is None else t.floor for t in report.tasks] + [avg["floor"] or math.nan]
    individual = [t.individual for t in report.tasks] + [avg["individual"] or 0.0]
    merged = [t.merged for t in report.tasks] + [avg["merged"] or 0.0]
    gains = [_gain(t.gain_retained, t.below_floor) for t in report.tasks]
    gains.append(_gain(avg["gain_retained"], bool(avg["below_floor"])))
    labels.append("average")
    x = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.8 * len(labels)), 4.5))
    floor_label = "base encoder + own head" if report.floor_kind == OWN_HEAD_FLOOR else "private head"
    ax.bar(x - 0.27, floor, 0.27, label=f"floor ({floor_label})", color="0.7")
    ax.bar(x, individual, 0.27, label="individual (own adapter)")
    ax.bar(x + 0.27, merged, 0.27, label="merged encoder + own head")
    for xi, top, gain in zip(x, np.fmax(np.fmax(floor, individual), merged), gains, strict=True):
        text = gain if isinstance(gain, str) else (f"{100 * gain:.0f}%" if _defined(gain) else "")
        ax.text(xi, top + 0.01, text, ha="center", va="bottom", fontsize=8)
    scores = [v for v in (*floor, *individual, *merged) if not math.isnan(v)]
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("test score (primary metric)")
    ax.set_ylim(min(0.0, *scores), max(1.0, *scores) * 1.1)
    ax.set_title("Floor, individual and merged; gain retained = (merged − floor) / (individual − floor)")
    fig.legend(loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
