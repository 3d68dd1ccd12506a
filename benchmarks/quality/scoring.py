"""Per-example correctness of the models the stress grid compares, for :mod:`benchmarks.significance`'s paired tests.

For each task of a cell: the individual model (base + the task's adapter) and the merged encoder with the task's
own head (:mod:`hf_dpmerge.analysis.task_models`, as ``hf-dpmerge evaluate`` scores them), on the same seeded
stratified subset of the validation split (for tuning) or the test split (reported). The test subset is the
split seed's (shared by every seed of the grid) unless ``test_subset_seed`` draws one per seed; then the
chosen example indices are kept (:attr:`Scorer.example_ids`) so a report counts distinct examples. Every stress
task's primary metric is accuracy, so a model's score is the mean of its 0/1 vector.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hf_dpmerge.analysis.evaluation import predict_logits
from hf_dpmerge.analysis.task_models import load_individual_model, load_merged_with_head, resolve_device
from hf_dpmerge.analysis.task_run import TaskRun, find_tokenizer, load_split, task_runs
from hf_dpmerge.data.metrics import predictions_from_logits
from hf_dpmerge.data.splits import stratified_subsample

Correct = dict[str, np.ndarray]  # task → 0/1 per example


@dataclass
class TaskExamples:
    run: TaskRun
    examples: object  # the tokenized split subset
    labels: np.ndarray


class Scorer:
    """Scores models of one cell on its tasks; each split's examples are loaded and tokenized once."""

    def __init__(self, runs_dir: Path, base_dir: Path, tasks: list[str], caps: dict[str, int | None],
                 test_subset_seed: int | None = None):
        self.runs = task_runs(runs_dir, tasks)
        for run in self.runs:
            if run.spec.metric != "accuracy":
                raise ValueError(f"task {run.task}: per-example scores need accuracy as the metric, not "
                                 f"{run.spec.metric}; pass --tasks with classification tasks")
        self.base_dir, self.caps = base_dir, caps
        self.tokenizer = find_tokenizer([self.runs[0].adapter_dir, base_dir])
        self.device = resolve_device(None)
        self.test_subset_seed = test_subset_seed
        self.example_ids: dict[str, list[int]] = {}  # task → test indices, when drawn per seed
        self._examples: dict[str, list[TaskExamples]] = {}

    def examples(self, split: str) -> list[TaskExamples]:
        if split not in self._examples:
            loaded = []
            per_seed = split == "test" and self.test_subset_seed is not None
            for run in self.runs:
                data = load_split(run, split, self.tokenizer, max_samples=None if per_seed else self.caps[split])
                if per_seed and self.caps[split] is not None:
                    ids = stratified_subsample(np.asarray(data["labels"]), self.caps[split], self.test_subset_seed)
                    data = data.select(ids)
                    self.example_ids[run.task] = [int(i) for i in ids]
                elif per_seed:
                    self.example_ids[run.task] = list(range(len(data)))
                loaded.append(TaskExamples(run, data, np.asarray(data["labels"])))
            self._examples[split] = loaded
        return self._examples[split]

    def _correct(self, load, splits: tuple[str, ...]) -> dict[str, Correct]:
        """Per split, per task 0/1 vectors of the model ``load(run)`` (loaded once per task for all splits)."""
        scores: dict[str, Correct] = {split: {} for split in splits}
        for index, run in enumerate(self.runs):
            model = load(run).to(self.device)
            for split in splits:
                item = self.examples(split)[index]
                logits = predict_logits(model, item.examples, self.tokenizer)
                predictions = predictions_from_logits(run.spec, logits)
                scores[split][run.task] = (np.asarray(predictions) == item.labels).astype(np.int8)
            del model
        return scores

    def individual(self, splits: tuple[str, ...]) -> dict[str, Correct]:
        """Each task's own adapter on the base, on each of ``splits``."""
        return self._correct(lambda run: load_individual_model(self.base_dir, run.adapter_dir, run.spec), splits)

    def merged(self, merged_dir: Path, split: str) -> Correct:
        """The merged encoder with each task's own head, on ``split``."""
        def load(run: TaskRun):
            return load_merged_with_head(merged_dir, run.adapter_dir, run.spec)

        return self._correct(load, (split,))[split]


def accuracy(correct: Correct) -> dict[str, float]:
    """Per-task accuracy of a 0/1 map."""
    return {task: float(np.mean(values)) for task, values in correct.items()}


def encode(correct: Correct) -> dict[str, str]:
    """The 0/1 vectors as strings of '0'/'1' (compact in the stored JSON)."""
    return {task: "".join("1" if v else "0" for v in values) for task, values in correct.items()}


def decode(stored: dict[str, str]) -> Correct:
    return {task: np.frombuffer(text.encode(), dtype=np.uint8) - ord("0") for task, text in stored.items()}
