"""A fresh linear probe: is a task still readable from an encoder's features, without the released head?

Removing a skill from a merged encoder (negation, ``safe_merge``) cannot be judged by the task's own head: the
head is part of the release, and a head fitted to other features may fail while the skill is still there. The
probe fits a new multinomial logistic regression on the encoder's pooled features f(x) (the head's input) of one
half of a split and reports its accuracy on the other half, for the base encoder and for the merged one:

    min_{W,b}  (1/n)·Σ_i CE(W·z_i + b, y_i) + l2·‖W‖²,   z = (f(x) − mean)/std over the fitting half

(L-BFGS, full batch). A skill the merge removed reads lower on the merged encoder than on the base; a control
task (one the merge should keep) shows what the edit costs everything else. The split is a choice of the user:
validation data, or public data of the task; the probe's scores are computed on that data and are not covered
by any release's guarantee.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from hf_dpmerge.analysis.task_models import quiet_from_pretrained, resolve_device
from hf_dpmerge.analysis.task_run import check_model_dirs, find_tokenizer, load_split, task_runs
from hf_dpmerge.modeling.pooled_features import pooled_features
from hf_dpmerge.records.run_folders import BASE_DIR

DEFAULT_L2 = 1e-3


@dataclass(frozen=True)
class ProbeResult:
    """Probe accuracy on the held-out half of ``split`` for the base and the merged encoder."""

    task: str
    base: float
    merged: float
    num_fit: int
    num_held_out: int

    @property
    def change(self) -> float:
        return self.merged - self.base


def fit_probe(features: torch.Tensor, labels: torch.Tensor, num_labels: int, l2: float = DEFAULT_L2,
              iterations: int = 200) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(W, b, mean, std) of the standardised multinomial logistic regression of the module docstring."""
    features = features.double()
    mean, std = features.mean(0), features.std(0).clamp(min=1e-8)
    z = (features - mean) / std
    weight = torch.zeros(num_labels, z.shape[1], dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(num_labels, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=iterations, line_search_fn="strong_wolfe")

    def objective() -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(z @ weight.T + bias, labels) + l2 * weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(objective)
    return weight.detach(), bias.detach(), mean, std


def probe_accuracy(fit: tuple[torch.Tensor, torch.Tensor], held_out: tuple[torch.Tensor, torch.Tensor],
                   num_labels: int, l2: float = DEFAULT_L2) -> float:
    """Accuracy on ``held_out`` (features, labels) of the probe fitted on ``fit``."""
    weight, bias, mean, std = fit_probe(*fit, num_labels, l2)
    features, labels = held_out
    predictions = (((features.double() - mean) / std) @ weight.T + bias).argmax(1)
    return float((predictions == labels).double().mean())


def probe_runs(
    runs_dir: str | os.PathLike,
    merged_dir: str | os.PathLike,
    tasks: Sequence[str] | None = None,
    *,
    split: str = "validation",
    max_samples: int | None = None,
    seed: int = 0,
    l2: float = DEFAULT_L2,
    base_dir: str | os.PathLike | None = None,
    tokenizer=None,
    max_length: int | None = None,
    data_seed: int | None = None,
    glue_path: str | None = None,
    batch_size: int = 32,
    device: str | torch.device | None = None,
    log=print,
) -> list[ProbeResult]:
    """For each task run (default: those the merge merged), probe the base and the merged encoder on ``split``
    (loaded as ``hf-dpmerge evaluate`` loads it: ``max_samples``, ``max_length``, ``data_seed``, ``glue_path``):
    fit on a seeded random half of its examples, score the other half (the same halves for both encoders)."""
    from transformers import DataCollatorWithPadding

    runs_dir, merged_dir = Path(runs_dir), Path(merged_dir)
    base_dir = runs_dir / BASE_DIR if base_dir is None else Path(base_dir)
    check_model_dirs(base_dir, merged_dir)
    device = resolve_device(device)
    results = []
    for run in task_runs(runs_dir, tasks, data_seed=data_seed, max_length=max_length, merged_dir=merged_dir):
        spec = run.spec
        if spec.num_labels < 2:
            raise ValueError(f"{run.task}: the probe is a classifier, and this task is a regression")
        tok = tokenizer or find_tokenizer([run.adapter_dir, base_dir, merged_dir])
        examples = load_split(run, split, tok, max_samples=max_samples, glue_path=glue_path)
        if len(examples) < 4:
            raise ValueError(f"{run.task}: {len(examples)} {split} examples are too few to fit and hold out a probe")
        labels = torch.as_tensor(examples["labels"])
        order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed))
        fit, held_out = order[: len(order) // 2], order[len(order) // 2:]
        collator = DataCollatorWithPadding(tok)
        scores = {}
        for kind, directory in (("base", base_dir), ("merged", merged_dir)):
            model = quiet_from_pretrained(directory, spec).to(device)
            features = pooled_features(model, examples, collator, batch_size).cpu()
            scores[kind] = probe_accuracy((features[fit], labels[fit]), (features[held_out], labels[held_out]),
                                          spec.num_labels, l2)
            del model
        result = ProbeResult(run.task, scores["base"], scores["merged"], len(fit), len(held_out))
        log(f"{run.task}: probe accuracy base {result.base:.4f}, merged {result.merged:.4f} "
            f"({result.change:+.4f}; fit on {result.num_fit}, scored on {result.num_held_out} {split} examples)")
        results.append(result)
    return results


def probe_table(results: Sequence[ProbeResult]) -> str:
    lines = ["task                 base probe   merged probe   change    n (fit / held out)"]
    lines += [f"{r.task:<20} {r.base:>10.4f}   {r.merged:>12.4f}   {r.change:>+7.4f}    {r.num_fit} / {r.num_held_out}"
              for r in results]
    return "\n".join(lines)


def probe_json(results: Sequence[ProbeResult]) -> list[dict]:
    return [{**asdict(r), "change": r.change} for r in results]
