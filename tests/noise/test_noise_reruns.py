"""The dp_aware noise model against re-runs that differ only in their DP noise (docs/design.md §6).

Every re-run trains the same tiny BERT (LoRA r = 4 on query/value, a trained head, AdamW, 20 steps, the alignment
penalty at its default λ = 0.05) with the same ``dp_seed``, so the same Poisson batches, and reseeds only the
noise generator. The variance across re-runs is the noise variance the merge should predict from each release's
weights and noise statistics. ``packaged`` is the packaged recipe's LoRA mode and learning rates on the same model:
A frozen at its public-seed draw (FFA-LoRA), the first quarter of the steps on the head alone, η = 2·10⁻³ for B
and 2·10⁻² for the head.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft.utils import get_peft_model_state_dict

from hf_dpmerge.lora import LoraFactor
from hf_dpmerge.noise.collection import collect_noise_stats
from hf_dpmerge.noise.variance import (
    alignment_restoring,
    capped_variance,
    lora_noise_variance,
    stats_noise_variance,
)
from hf_dpmerge.training.shared_lora_a import freeze_shared_lora_a
from tests.utils.merging_builders import adamw_record
from tests.utils.training_helpers import lora_classifier, make_trainer, text_dataset

RERUNS, STEPS, BATCH, SCALING = 96, 20, 8, 2.0  # lora_classifier: lora_alpha 8 / r 4
PACKAGED = dict(head_warmup_steps=0.25, learning_rate=2e-3, head_learning_rate=2e-2)
# σ = 0.25 with dp_sat read within 0.02 of σ = 0.25 without SAM in every kind (docs/design.md §6): not re-run here
SETTINGS = {"sigma1_dp_sat": (1.0, "dp_sat", False), "sigma0.25_no_sam": (0.25, "none", False),
            "packaged": (0.5, "dp_sat", True)}
KINDS = ("lora_A", "lora_B", "delta", "head.weight", "head.bias")
WALK = "lora_B walk"  # the penalty-aware walk alone, before the cap by the released B
HEAD = "base_model.model.classifier."


def _rerun(tmp_path: Path, sigma: float, sam_mode: str, packaged: bool,
           noise_seed: int) -> tuple[dict, dict, object, object]:
    model = lora_classifier()
    if packaged:
        freeze_shared_lora_a(model)
    start = {name: value.detach().clone() for name, value in get_peft_model_state_dict(model).items()}
    trainer = make_trainer(tmp_path, model=model, dataset=text_dataset(copies=5), max_steps=STEPS,
                           noise_multiplier=sigma, target_epsilon=None, sam_mode=sam_mode,
                           per_device_train_batch_size=BATCH, physical_batch_size=BATCH,
                           **(PACKAGED if packaged else {}))
    trainer.dp_state.noise_generator.manual_seed(noise_seed)  # dp_seed fixed the Poisson stream: only noise differs
    trainer.train()
    final = {name: value.detach().clone() for name, value in get_peft_model_state_dict(trainer.model).items()}
    return start, final, collect_noise_stats(trainer), trainer.dp_state.sample_generator.get_state()


def _predicted(sigma: float, start: dict, final: dict, stats: object) -> dict[str, float]:
    """Σ over the tensors of each kind of the predicted per-coordinate variance, as the merge computes it."""
    record = adamw_record(noise_multiplier=sigma, max_grad_norm=1.0, expected_batch_size=BATCH, align_lambda=0.05)
    totals = dict.fromkeys((*KINDS, WALK), 0.0)
    for name_a in (name for name in final if ".lora_A." in name):
        name_b = name_a.replace(".lora_A.", ".lora_B.")
        factor = LoraFactor("layer", final[name_a], final[name_b], SCALING, saved_a=name_a, saved_b=name_b)
        variance_a = stats_noise_variance(record, stats, name_a, alignment_restoring(record, factor, name_a))
        variance_a = 0.0 if variance_a is None else variance_a  # a frozen A is not in the statistics
        walk_b = stats_noise_variance(record, stats, name_b, alignment_restoring(record, factor, name_b))
        variance_b = capped_variance(walk_b, final[name_b])
        totals["lora_A"] += float(torch.as_tensor(variance_a).expand(final[name_a].shape).sum())
        totals["lora_B"] += float(variance_b.sum())
        totals[WALK] += float(walk_b.sum())
        totals["delta"] += float(lora_noise_variance(final[name_a], final[name_b], SCALING, variance_a,
                                                     variance_b).sum())
    for leaf in ("weight", "bias"):
        name = HEAD + leaf
        totals[f"head.{leaf}"] = float(capped_variance(stats_noise_variance(record, stats, name),
                                                       final[name] - start[name]).sum())
    return totals


def _measured(finals: list[dict]) -> dict[str, float]:
    """Σ over the tensors of each kind of the per-coordinate variance across the re-runs."""
    def spread(values: list[torch.Tensor]) -> float:
        return float(torch.stack(values).double().var(dim=0).sum())

    totals = dict.fromkeys((*KINDS, WALK), 0.0)
    for name_a in (name for name in finals[0] if ".lora_A." in name):
        name_b = name_a.replace(".lora_A.", ".lora_B.")
        totals["lora_A"] += spread([final[name_a] for final in finals])
        totals["lora_B"] += spread([final[name_b] for final in finals])
        totals[WALK] += spread([final[name_b] for final in finals])
        totals["delta"] += spread([SCALING * final[name_b] @ final[name_a] for final in finals])
    for leaf in ("weight", "bias"):
        totals[f"head.{leaf}"] = spread([final[HEAD + leaf] for final in finals])
    return totals


@pytest.fixture(scope="module")
def ratios(tmp_path_factory):
    """predicted / measured variance per setting and kind (each setting trained once, on first use)."""
    cache: dict[str, dict[str, float]] = {}

    def get(setting: str) -> dict[str, float]:
        if setting not in cache:
            sigma, sam_mode, packaged = SETTINGS[setting]
            runs = [_rerun(tmp_path_factory.mktemp(setting), sigma, sam_mode, packaged, 1000 + seed)
                    for seed in range(RERUNS)]
            assert all(torch.equal(run[3], runs[0][3]) for run in runs)  # the same Poisson draws in every re-run
            finals = [run[1] for run in runs]
            predicted = [_predicted(sigma, start, final, stats) for start, final, stats, _ in runs]
            measured = _measured(finals)
            cache[setting] = {kind: sum(p[kind] for p in predicted) / RERUNS / measured[kind] if measured[kind] else
                              float("nan" if any(p[kind] for p in predicted) else 1.0) for kind in (*KINDS, WALK)}
        return cache[setting]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("kind", [*KINDS, WALK])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_predicted_noise_variance_matches_noise_only_reruns(ratios, setting: str, kind: str) -> None:
    """Every kind within 0.8–1.25 of the measured variance at σ = 1 with SAM, σ = 0.25 without, and in the
    packaged recipe's mode (σ = 0.5, SAM); so is lora_B's walk alone once it includes the alignment penalty's pull
    (without it the walk over-stated lora_B 2.1× at σ = 0.25, 7.8× in the packaged recipe). The head bias follows
    the trainer's linearised response (a constant-signal walk gave 0.04–0.44: its signal, the batch's label mix,
    changes every step); with 2 coordinates its measured variance needs the 96 re-runs (standard error ≈ 10 %; 32
    re-runs scatter it by ±25 %)."""
    ratio = ratios(setting)[kind]
    assert 0.8 <= ratio <= 1.25, f"{setting} {kind}: predicted/measured {ratio:.3f}"
