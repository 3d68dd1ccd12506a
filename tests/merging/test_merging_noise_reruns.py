"""The dp_aware noise model against re-runs that differ only in their DP noise (docs/design.md §6).

Every re-run trains the same tiny BERT (LoRA r = 4 on query/value, a trained head, AdamW, 20 steps) with the
same ``dp_seed``, so the same Poisson batches, and reseeds only the noise generator. The variance across
re-runs is the noise variance the merge should predict from each release's weights and noise statistics.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft.utils import get_peft_model_state_dict

from hf_dpmerge.merging.noise_variance import capped_variance, lora_noise_variance, stats_noise_variance
from hf_dpmerge.training.noise_stats import collect_noise_stats
from tests.utils.merging_builders import adamw_record
from tests.utils.training_helpers import lora_classifier, make_trainer, text_dataset

RERUNS, STEPS, BATCH, SCALING = 8, 20, 8, 2.0  # lora_classifier: lora_alpha 8 / r 4
SETTINGS = {"sigma1_dp_sat": (1.0, "dp_sat"), "sigma0.25_dp_sat": (0.25, "dp_sat"), "sigma0.25_no_sam": (0.25, "none")}
KINDS = ("lora_A", "lora_B", "delta", "head.weight", "head.bias")
HEAD = "base_model.model.classifier."


def _rerun(tmp_path: Path, sigma: float, sam_mode: str, noise_seed: int) -> tuple[dict, dict, object, object]:
    model = lora_classifier()
    start = {name: value.detach().clone() for name, value in get_peft_model_state_dict(model).items()}
    trainer = make_trainer(tmp_path, model=model, dataset=text_dataset(copies=5), max_steps=STEPS,
                           noise_multiplier=sigma, target_epsilon=None, sam_mode=sam_mode,
                           per_device_train_batch_size=BATCH, physical_batch_size=BATCH)
    trainer.dp_state.noise_generator.manual_seed(noise_seed)  # dp_seed fixed the Poisson stream: only noise differs
    trainer.train()
    final = {name: value.detach().clone() for name, value in get_peft_model_state_dict(trainer.model).items()}
    return start, final, collect_noise_stats(trainer), trainer.dp_state.sample_generator.get_state()


def _predicted(sigma: float, start: dict, final: dict, stats: object) -> dict[str, float]:
    """Σ over the tensors of each kind of the predicted per-coordinate variance, as the merge computes it."""
    record = adamw_record(noise_multiplier=sigma, max_grad_norm=1.0, expected_batch_size=BATCH)
    totals = dict.fromkeys(KINDS, 0.0)
    for name_a in (name for name in final if ".lora_A." in name):
        name_b = name_a.replace(".lora_A.", ".lora_B.")
        variance_a = stats_noise_variance(record, stats, name_a)
        variance_b = capped_variance(stats_noise_variance(record, stats, name_b), final[name_b])
        totals["lora_A"] += float(variance_a.sum())
        totals["lora_B"] += float(variance_b.sum())
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

    totals = dict.fromkeys(KINDS, 0.0)
    for name_a in (name for name in finals[0] if ".lora_A." in name):
        name_b = name_a.replace(".lora_A.", ".lora_B.")
        totals["lora_A"] += spread([final[name_a] for final in finals])
        totals["lora_B"] += spread([final[name_b] for final in finals])
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
            sigma, sam_mode = SETTINGS[setting]
            runs = [_rerun(tmp_path_factory.mktemp(setting), sigma, sam_mode, 1000 + seed) for seed in range(RERUNS)]
            assert all(torch.equal(run[3], runs[0][3]) for run in runs)  # the same Poisson draws in every re-run
            finals = [run[1] for run in runs]
            predicted = [_predicted(sigma, start, final, stats) for start, final, stats, _ in runs]
            measured = _measured(finals)
            cache[setting] = {kind: sum(p[kind] for p in predicted) / RERUNS / measured[kind] for kind in KINDS}
        return cache[setting]

    return get


BIAS_GAP = pytest.mark.xfail(strict=True, reason=(
    "the head bias is signal-driven (r̂ ≈ 2.4 at σ = 1, ≈ 10 at σ = 0.25): its spread comes from the other weights' "
    "noise changing its gradient, which a per-coordinate walk does not model (predicted/measured 0.44, 0.04)"))


@pytest.mark.slow
@pytest.mark.parametrize("kind", [pytest.param(k, marks=BIAS_GAP) if k == "head.bias" else k for k in KINDS])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_predicted_noise_variance_matches_noise_only_reruns(ratios, setting: str, kind: str) -> None:
    """lora_A, lora_B, ΔW and the head weight within 0.8–1.25 of the measured variance at σ = 1 and 0.25, with
    and without SAM (the random walk alone over-stated lora_B 2.1× and ΔW 2.4× at σ = 0.25)."""
    ratio = ratios(setting)[kind]
    assert 0.8 <= ratio <= 1.25, f"{setting} {kind}: predicted/measured {ratio:.3f}"
