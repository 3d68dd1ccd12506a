"""Task grouping: Gram-trace similarity vs the dense one, sign conflicts, clusters and ``hf-dpmerge similarity``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from mergekit.config import MergeConfiguration

from hf_dpmerge.cli.main import main
from hf_dpmerge.lora import LoraFactor
from hf_dpmerge.merging.merge_config import METHOD_PARAMETERS
from hf_dpmerge.merging.planning import task_similarity
from hf_dpmerge.merging.planning.merge_groups import merge_groups
from hf_dpmerge.merging.planning.task_similarity import (
    SimilarityReport,
    load_task_vector,
    lora_inner_product,
    lora_sign_conflicts,
    lora_sq_norm,
)
from tests.utils.task_vector_builders import (
    delta,
    lora_modules,
    orthogonal_pair,
    random_factors,
    save_adapter,
    save_runs_base,
)


def _random_lora(seed: int, rank: int, scaling: float, d_out: int = 24, d_in: int = 40) -> LoraFactor:
    generator = torch.Generator().manual_seed(seed)
    lora_a, lora_b = torch.randn(rank, d_in, generator=generator), torch.randn(d_out, rank, generator=generator)
    return LoraFactor("layer", lora_a, lora_b, scaling)


def _dense(factors: LoraFactor) -> torch.Tensor:
    return factors.scaling * factors.lora_b.double() @ factors.lora_a.double()


@pytest.mark.parametrize(("rank_1", "rank_2", "scaling_1", "scaling_2"),
                         [(3, 5, 2.0, 0.5), (8, 8, 1.0, 1 / math.sqrt(8))])
def test_gram_trace_statistics_equal_the_dense_ones(monkeypatch, rank_1, rank_2, scaling_1, scaling_2) -> None:
    first, second = _random_lora(1, rank_1, scaling_1), _random_lora(2, rank_2, scaling_2)
    dense_1, dense_2 = _dense(first), _dense(second)
    assert lora_inner_product(first, second) == pytest.approx(float((dense_1 * dense_2).sum()), rel=1e-10)
    assert lora_sq_norm(first) == pytest.approx(float(dense_1.square().sum()), rel=1e-10)
    monkeypatch.setattr(task_similarity, "BLOCK_ELEMENTS", 3 * 40)  # 3-row blocks, the last one partial (24 rows)
    assert lora_sign_conflicts(first, second) == (int((dense_1 * dense_2 < 0).sum()), 24 * 40)


def _report(cosine: list[list[float]]) -> SimilarityReport:
    n = len(cosine)
    names = [f"t{i}" for i in range(n)]
    matrix = torch.tensor(cosine).numpy()  # non-private adapters: the noise-aware cosine is the cosine
    return SimilarityReport(names, names, [1.0] * n, matrix, torch.zeros(n, n).numpy(), [0.0] * n, matrix,
                            np.stack([matrix, matrix], axis=-1))


def test_clusters_join_while_the_mean_cosine_reaches_the_threshold() -> None:
    report = _report([[1.0, 0.9, 0.1, 0.0], [0.9, 1.0, 0.3, 0.0], [0.1, 0.3, 1.0, 0.6], [0.0, 0.0, 0.6, 1.0]])
    assert merge_groups(report, 0.5) == [["t0", "t1"], ["t2", "t3"]]
    assert merge_groups(report, 0.85) == [["t0", "t1"], ["t2"], ["t3"]]
    # average linkage: {t0,t1}–{t2,t3} mean cosine = (0.1 + 0 + 0.3 + 0) / 4 = 0.1
    assert merge_groups(report, 0.1) == [["t0", "t1", "t2", "t3"]]
    assert merge_groups(report, 0.11) == [["t0", "t1"], ["t2", "t3"]]
    with pytest.raises(ValueError, match="--threshold"):
        merge_groups(report, 1.5)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Known task vectors: ``near`` ≈ ``task`` (+1e-3 noise), ``negated`` = −``task``, ``orthogonal`` ⟂ ``task``."""
    root = tmp_path_factory.mktemp("similarity") / "runs"
    save_runs_base(root)
    task, orthogonal = orthogonal_pair(seed=3)
    generator = torch.Generator().manual_seed(4)
    near = {m: (a + 1e-3 * torch.randn(a.shape, generator=generator), b) for m, (a, b) in task.items()}
    negated = {m: (a, -b) for m, (a, b) in task.items()}
    for name, factors in (("task", task), ("near", near), ("orthogonal", orthogonal), ("negated", negated)):
        save_adapter(root, name, factors)
    return root


def test_known_task_vectors_have_the_known_cosines_and_conflicts(runs: Path) -> None:
    vectors = [load_task_vector(runs / name) for name in ("task", "near", "orthogonal", "negated")]
    assert [v.adapter_dir.name for v in vectors] == ["encoder_adapter"] * 4
    report = task_similarity.task_similarity(vectors)
    cos, conflict = report.cosine, report.sign_conflict
    assert cos[0, 1] == pytest.approx(1.0, abs=1e-4)
    assert cos[0, 2] == pytest.approx(0.0, abs=1e-6) and cos[1, 2] == pytest.approx(0.0, abs=1e-3)
    assert cos[0, 3] == pytest.approx(-1.0, abs=1e-9)
    assert conflict[0, 3] == 1.0 and conflict[0, 1] < 0.01
    assert 0.35 < conflict[0, 2] < 0.65  # unrelated dense vectors disagree on about half the coordinates
    norm = math.sqrt(sum(float(delta(orthogonal_pair(3)[0], m).square().sum()) for m in lora_modules()))
    assert report.norms[0] == pytest.approx(norm, rel=1e-6)
    assert merge_groups(report, 0.5) == [["task", "near"], ["orthogonal"], ["negated"]]


def test_similarity_command_writes_heatmap_results_and_one_config_per_group(runs: Path, tmp_path: Path,
                                                                          monkeypatch, capsys) -> None:
    monkeypatch.chdir(runs.parent)
    out = tmp_path / "similarity"
    assert main(["similarity", "runs/task", "runs/near", "runs/orthogonal/encoder_adapter", "--threshold", "0.5",
                 "--method", "task_arithmetic", "--output_dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "task, near ->" in printed and "orthogonal (alone" in printed
    assert sorted(p.name for p in out.iterdir()) == ["merge_group_1.yaml", "similarity.json", "similarity.png"]
    results = json.loads((out / "similarity.json").read_text())
    assert results["groups"] == [["task", "near"], ["orthogonal"]] and results["threshold"] == 0.5
    config = MergeConfiguration.model_validate(yaml.safe_load((out / "merge_group_1.yaml").read_text()))
    assert config.merge_method == "task_arithmetic"
    run_line = next(line for line in (out / "merge_group_1.yaml").read_text().splitlines() if "# Run:" in line)
    assert f"mergekit-yaml {out / 'merge_group_1.yaml'} " in run_line  # where the config is, not the staging
    assert [str(m.model) for m in config.models] == ["./runs/base+./runs/task/encoder_adapter",
                                                     "./runs/base+./runs/near/encoder_adapter"]
    assert config.parameters == METHOD_PARAMETERS["task_arithmetic"]  # the shipped task_arithmetic.yaml's

    (out / "mine.txt").write_text("keep")
    assert main(["similarity", "runs/task", "runs/near", "--output_dir", str(out)]) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert main(["similarity", "runs/task", "runs/near", "--output_dir", str(out), "--overwrite"]) == 0
    assert not (out / "mine.txt").exists() and (out / "merge_group_1.yaml").exists()


@pytest.mark.parametrize(("arguments", "message"), [
    (["runs/task"], "need at least two adapters"),
    (["runs/task", "runs/missing"], "runs/missing does not exist"),
    (["runs/task", "runs"], "neither a run folder"),
    (["runs/task", "runs/near", "--base", "nowhere"], "--base nowhere has no config.json"),
    (["runs/task", "runs/near", "--method", "linear"], "invalid choice"),
])
def test_similarity_command_refuses_bad_input(runs: Path, tmp_path: Path, monkeypatch, capsys, arguments,
                                              message) -> None:
    monkeypatch.chdir(runs.parent)
    try:
        code = main(["similarity", *arguments, "--output_dir", str(tmp_path / "out")])
    except SystemExit as exit_:  # argparse's own refusals
        code = exit_.code
    assert code != 0 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_adapters_of_different_bases_are_refused(runs: Path, tmp_path: Path) -> None:
    other = save_adapter(tmp_path, "other", random_factors(9), base_model_hash="sha256:" + "1" * 64)
    hashed = save_adapter(tmp_path, "hashed", random_factors(8), base_model_hash="sha256:" + "2" * 64)
    with pytest.raises(ValueError, match="different base models"):
        task_similarity.task_similarity([load_task_vector(other), load_task_vector(hashed)])


def _noisy_shared_a_adapter(runs: Path, task: str, signal: dict[str, torch.Tensor], seed: int,
                            noise_std: float = 0.01) -> tuple[Path, dict[str, torch.Tensor]]:
    """``runs/<task>/encoder_adapter`` with A frozen (shared seed), B = ``signal`` + N(0, noise_std²) — the noise
    its record predicts (V_B = Σ η² = 1e-4 for the AdamW record) — and the clean B by parameter name."""
    from hf_dpmerge.records.fingerprint import base_fingerprint, peft_base_tensors
    from hf_dpmerge.training.encoder_adapter import export_encoder_adapter
    from hf_dpmerge.training.shared_lora_a import freeze_shared_lora_a, frozen_lora_a_record
    from tests.utils.merging_builders import adamw_record
    from tests.utils.training_helpers import lora_classifier

    model = lora_classifier(seed=0)
    freeze_shared_lora_a(model, 5)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".lora_B." in name:
                parameter.copy_(signal[name] + noise_std * torch.randn(parameter.shape, generator=generator))
    tensors = peft_base_tensors(model)
    adapter = runs / task / "adapter"
    model.save_pretrained(adapter)
    adamw_record(task=task, base_model_hash=base_fingerprint(tensors), base_model_hash_tensors=sorted(tensors),
                 extra={"lora_a": frozen_lora_a_record(model)}).save(adapter)
    return export_encoder_adapter(adapter, runs / task / "encoder_adapter"), model


def test_noise_aware_cosine_recovers_the_noise_free_cosine_that_dp_noise_hides(tmp_path):
    """Two DP adapters sharing a weak signal: the raw cosine is shrunk toward 0 by their independent noise, the
    noise-aware one (record-predicted noise energy removed) is the noise-free cosine within its interval, and
    grouping finds the pair; an unrelated third adapter stays apart."""
    from tests.utils.training_helpers import lora_classifier

    shapes = {n: p.shape for n, p in lora_classifier(seed=0).named_parameters() if ".lora_B." in n}
    generator = torch.Generator().manual_seed(0)
    shared = {n: 0.006 * torch.randn(shape, generator=generator) for n, shape in shapes.items()}
    other = {n: 0.006 * torch.randn(shape, generator=generator) for n, shape in shapes.items()}
    related = {n: 0.8 * t + 0.6 * 0.006 * torch.randn(t.shape, generator=generator) for n, t in shared.items()}
    dirs = [_noisy_shared_a_adapter(tmp_path, task, signal, seed)[0]
            for task, signal, seed in (("alpha", shared, 1), ("beta", related, 2), ("gamma", other, 3))]
    report = task_similarity.task_similarity([load_task_vector(d) for d in dirs])
    # A is shared and frozen: cos(s·B₁·A, s·B₂·A) of the clean B's, exactly, from dense ΔW
    dense = []
    for signal in (shared, related):
        by_module = {n.removeprefix("base_model.model.").split(".lora_B")[0]: t for n, t in signal.items()}
        dense.append(torch.cat([(f.scaling * by_module[layer.removesuffix(".weight")].double()
                                 @ f.lora_a.double()).flatten()
                                for layer, f in load_task_vector(dirs[0]).factors.items()]))
    truth = float(dense[0] @ dense[1] / (dense[0].norm() * dense[1].norm()))
    assert truth > 0.6
    assert report.cosine[0, 1] < truth - 0.2  # the noise hides most of it
    low, high = report.denoised_interval[0, 1]
    assert low <= truth <= high and abs(report.denoised_cosine[0, 1] - truth) < 0.15
    assert low > 0.3 and report.denoised_interval[0, 2][0] < 0 < report.denoised_interval[0, 2][1]
    assert merge_groups(report, 0.3) == [["alpha", "beta"], ["gamma"]]  # the whole interval clears 0.3
    assert "noise-aware cosine [95 % interval" in report.table()


def test_where_the_predicted_noise_is_not_below_an_adapters_energy_grouping_uses_the_raw_cosine():
    """Independent noise only shrinks the raw cosine toward 0: where the noise-aware one is undefined the raw one
    is the conservative estimate, so a visible relation still groups (the noise model may over-state)."""
    names = ["t0", "t1", "t2"]
    raw = np.array([[1.0, 0.36, 0.03], [0.36, 1.0, 0.02], [0.03, 0.02, 1.0]])
    undefined = np.full((3, 3), np.nan)
    report = SimilarityReport(names, names, [1.0] * 3, raw, np.zeros((3, 3)), [1.01] * 3, undefined,
                              np.full((3, 3, 2), np.nan))
    np.testing.assert_array_equal(report.grouping_cosine, raw)
    assert merge_groups(report, 0.3) == [["t0", "t1"], ["t2"]]
    assert "grouped by the raw cosine" in report.table()


def test_the_interval_carries_the_noise_models_error_and_grouping_needs_all_of_it_above_the_threshold(tmp_path):
    """At noise shares near 0.9 the denominator ‖τ̃‖² − N is a small remainder: ±20 % on the predicted N moves
    the corrected cosine by a factor of several. The interval holds the corrected cosine recomputed from the raw
    one at 0.8·N (and runs to 1 where 1.2·N reaches an adapter's energy); a threshold inside it does not join."""
    from tests.utils.training_helpers import lora_classifier

    shapes = {n: p.shape for n, p in lora_classifier(seed=0).named_parameters() if ".lora_B." in n}
    generator = torch.Generator().manual_seed(0)
    shared = {n: 0.0045 * torch.randn(shape, generator=generator) for n, shape in shapes.items()}
    related = {n: 0.8 * t + 0.6 * 0.0045 * torch.randn(t.shape, generator=generator) for n, t in shared.items()}
    dirs = [_noisy_shared_a_adapter(tmp_path, task, signal, seed)[0]
            for task, signal, seed in (("alpha", shared, 1), ("beta", related, 2))]
    report = task_similarity.task_similarity([load_task_vector(d) for d in dirs])
    shares = [energy / norm**2 for energy, norm in zip(report.noise_energy, report.norms, strict=True)]
    assert min(shares) > 0.84 and max(shares) * 1.2 > 1.0, shares
    low, high = report.denoised_interval[0, 1]
    at_less_noise = report.cosine[0, 1] / math.sqrt((1 - 0.8 * shares[0]) * (1 - 0.8 * shares[1]))
    assert low <= at_less_noise <= report.denoised_cosine[0, 1] <= high == 1.0
    assert high - low > 0.6  # sampling alone: [0.49, 0.92] at these shares (0.87, 0.85)
    straddled = (low + report.denoised_cosine[0, 1]) / 2
    assert merge_groups(report, straddled) == [["alpha"], ["beta"]]  # the point estimate clears it, the interval not
    assert merge_groups(report, low - 0.01) == [["alpha", "beta"]]
    assert json.loads(json.dumps(report.to_dict()))["noise_model_relative_error"] == 0.2
