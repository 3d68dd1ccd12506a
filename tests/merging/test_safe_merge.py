"""safe_merge (kernel against a brute-force formula, mergekit wiring, config checks) and score weights."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from mergekit.merge_methods import merge_tensors
from safetensors.torch import load_file

from hf_dpmerge.cli.main import main
from hf_dpmerge.merging.methods.safe_merge import percentile_threshold, safe_merge_tensor
from hf_dpmerge.merging.planning.score_weights import softmax_weights
from tests.utils.merging_builders import full_config_yaml, save_base, save_task_adapter, save_variant

REPO = Path(__file__).resolve().parents[2]


def _brute_force(base, useful, weights, unwanted, percentile, scale):
    """Entry by entry in numpy: keep where max_u |τ_u| ≤ the nearest-rank percentile of that risk."""
    b = base.double().numpy()
    risk = np.max([np.abs(u.double().numpy() - b) for u in unwanted], axis=0)
    ordered = np.sort(risk.ravel())
    threshold = ordered[max(1, math.ceil(percentile / 100 * ordered.size)) - 1]
    out = b.copy()
    for index in np.ndindex(b.shape):
        if risk[index] <= threshold:
            out[index] += scale * sum(w * (t.double().numpy()[index] - b[index]) for t, w in zip(useful, weights))
    return torch.from_numpy(out)


@pytest.mark.parametrize("percentile", [0.0, 10.0, 50.0, 73.0, 100.0])
@pytest.mark.parametrize("unwanted_count", [1, 2])
def test_kernel_matches_the_brute_force_formula(percentile: float, unwanted_count: int) -> None:
    generator = torch.Generator().manual_seed(3)
    base = torch.randn(9, 7, generator=generator)
    useful = [base + torch.randn(9, 7, generator=generator) for _ in range(2)]
    unwanted = [base + torch.randn(9, 7, generator=generator) for _ in range(unwanted_count)]
    ours = safe_merge_tensor(base, useful, [0.7, 1.3], unwanted, percentile=percentile, scale=0.5)
    expected = _brute_force(base, useful, [0.7, 1.3], unwanted, percentile, 0.5)
    torch.testing.assert_close(ours.double(), expected, atol=1e-5, rtol=1e-5)
    kept = int((ours != base).sum())
    assert kept == max(1, math.ceil(percentile / 100 * base.numel()))  # continuous risks: exactly ⌈p·n/100⌉ kept


def test_percentile_100_is_task_arithmetic_and_untouched_tensors_get_everything() -> None:
    generator = torch.Generator().manual_seed(0)
    base = torch.randn(6, 5, generator=generator)
    useful = [base + torch.randn(6, 5, generator=generator) for _ in range(3)]
    unwanted = base + torch.randn(6, 5, generator=generator)
    ours = safe_merge_tensor(base, useful, [1.0, 0.5, 2.0], [unwanted], percentile=100, scale=0.3)
    theirs = merge_tensors([base, *useful], "task_arithmetic", parameters={"weight": [1.0, 0.5, 2.0], "lambda": 0.3},
                           base_index=0)
    torch.testing.assert_close(ours, theirs)
    untouched = safe_merge_tensor(base, useful, [1.0, 0.5, 2.0], [base.clone()], percentile=0, scale=0.3)
    torch.testing.assert_close(untouched, theirs)


def _projector(unwanted, base):
    """P onto the column space of the marked task vectors, from the pseudo-inverse (float64): V·V⁺, with float32's
    rounding of W_u − W_0 below the cut-off (else it counts as rank)."""
    stacked = torch.cat([(u - base).double() for u in unwanted], dim=1)
    return stacked @ torch.linalg.pinv(stacked, rtol=1e-5)


@pytest.mark.parametrize("projection", ["away", "onto"])
def test_projection_kernel_matches_the_pseudo_inverse_projector(projection) -> None:
    """Unwanted task vectors of rank 2 and 1 (LoRA-like s·B·A) span a 3-dimensional output subspace; the useful
    vectors are projected away from it (nothing of them is left inside) or onto it."""
    generator = torch.Generator().manual_seed(0)
    base = torch.randn(12, 9, generator=generator)
    unwanted = [base + torch.randn(12, 2, generator=generator) @ torch.randn(2, 9, generator=generator),
                base + torch.randn(12, 1, generator=generator) @ torch.randn(1, 9, generator=generator)]
    useful = [base + torch.randn(12, 9, generator=generator) for _ in range(2)]
    ours = safe_merge_tensor(base, useful, [1.0, 0.5], unwanted, percentile=50, scale=0.7, projection=projection)
    combined = sum(w * (t - base).double() for t, w in zip(useful, [1.0, 0.5]))
    inside = _projector(unwanted, base) @ combined
    expected = base.double() + 0.7 * (inside if projection == "onto" else combined - inside)
    torch.testing.assert_close(ours.double(), expected, atol=1e-5, rtol=0)
    if projection == "away":  # nothing left in the unwanted outputs' directions
        assert (_projector(unwanted, base) @ (ours - base).double()).abs().max() < 1e-5


def test_projection_of_a_tensor_the_marked_input_left_unchanged() -> None:
    base, useful = torch.zeros(4, 3), [torch.ones(4, 3)]
    assert torch.equal(safe_merge_tensor(base, useful, [1.0], [base.clone()], percentile=50, scale=1.0,
                                         projection="away"), useful[0])
    assert torch.equal(safe_merge_tensor(base, useful, [1.0], [base.clone()], percentile=50, scale=1.0,
                                         projection="onto"), base)
    bias = safe_merge_tensor(torch.zeros(3), [torch.tensor([1.0, 2.0, 3.0])], [1.0], [torch.tensor([0.0, 1.0, 0.0])],
                             percentile=50, scale=1.0, projection="away")
    torch.testing.assert_close(bias, torch.tensor([1.0, 0.0, 3.0]))  # a 1-D tensor: the span of the τ_u


def test_percentile_threshold_is_nearest_rank() -> None:
    values = torch.tensor([5.0, 1.0, 4.0, 2.0, 3.0])
    assert [float(percentile_threshold(values, p)) for p in (0, 20, 21, 50, 100)] == [1.0, 1.0, 2.0, 3.0, 5.0]


def test_kernel_refuses_missing_roles() -> None:
    base = torch.zeros(3)
    with pytest.raises(ValueError, match="unwanted: true"):
        safe_merge_tensor(base, [base + 1], [1.0], [], percentile=50, scale=1.0)


def test_softmax_weights() -> None:
    weights = softmax_weights([0.9, 0.2, 0.5], temperature=0.1)
    exps = [math.exp(s / 0.1) for s in (0.9, 0.2, 0.5)]
    assert weights == pytest.approx([e / sum(exps) for e in exps])
    assert softmax_weights([1000.0, 0.0], 1.0) == pytest.approx([1.0, 0.0])  # stable: no overflow
    assert softmax_weights([0.9, 0.2], 1e6) == pytest.approx([0.5, 0.5], abs=1e-6)
    with pytest.raises(ValueError, match="--temperature"):
        softmax_weights([1.0], 0.0)


@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("safe")
    base = save_base(root / "base")
    return base, [save_variant(base, root / f"v{seed}", seed) for seed in (1, 2, 3)]


def test_mergekit_runs_safe_merge_with_the_weights_from_the_config(variants, tmp_path, monkeypatch) -> None:
    base, (good1, good2, bad) = variants
    per_model = {good1: "", good2: "    parameters: {weight: 0.5}\n", bad: "    parameters: {unwanted: true}\n"}
    models = "".join(f"  - model: {path}\n{extra}" for path, extra in per_model.items())
    config = tmp_path / "safe.yaml"
    config.write_text(f"merge_method: safe_merge\nbase_model: {base}\nmodels:\n{models}dtype: float32\n"
                      "parameters: {percentile: 30, scale: 0.8}\n")
    assert main(["merge", str(config), str(tmp_path / "out"), "--quiet"]) == 0
    merged = load_file(tmp_path / "out" / "model.safetensors")
    name = "bert.encoder.layer.0.attention.self.query.weight"
    tensors = [load_file(p / "model.safetensors")[name] for p in (base, good1, good2, bad)]
    expected = _brute_force(tensors[0], tensors[1:3], [1.0, 0.5], [tensors[3]], 30.0, 0.8)
    torch.testing.assert_close(merged[name].double(), expected, atol=1e-5, rtol=1e-5)


def test_mergekit_runs_safe_merge_projecting_away_from_the_unwanted_subspace(variants, tmp_path) -> None:
    base, (good1, good2, bad) = variants
    config = tmp_path / "away.yaml"
    config.write_text(f"merge_method: safe_merge\nbase_model: {base}\nmodels:\n  - model: {good1}\n"
                      f"  - model: {good2}\n  - model: {bad}\n    parameters: {{unwanted: true}}\ndtype: float32\n"
                      "parameters: {projection: away, scale: 0.8}\n")
    assert main(["merge", str(config), str(tmp_path / "out"), "--quiet"]) == 0
    merged = load_file(tmp_path / "out" / "model.safetensors")
    name = "bert.encoder.layer.0.attention.self.query.weight"
    tensors = [load_file(p / "model.safetensors")[name] for p in (base, good1, good2, bad)]
    expected = safe_merge_tensor(tensors[0], tensors[1:3], [1.0, 1.0], [tensors[3]], percentile=50, scale=0.8,
                                 projection="away")
    torch.testing.assert_close(merged[name], expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize(("extra", "shared", "message"), [
    ("", "", "mark the model"),                                            # no unwanted input
    ("    parameters: {unwated: true}\n", "", "unknown per-model parameter"),  # a typo must not silently merge it
    ("    parameters: {unwanted: true}\n", "parameters: {projection: sideways}\n",
     "Input should be 'none', 'away' or 'onto'"),
    ("    parameters: {unwanted: true}\n", "parameters: {projection: away, percentile: 30}\n", "remove one of them"),
], ids=["unmarked", "typo", "projection", "projection_and_percentile"])
def test_bad_safe_merge_configs_fail_before_any_output(variants, tmp_path, capsys, extra, shared, message) -> None:
    base, (good1, _, bad) = variants
    config = tmp_path / "bad.yaml"
    config.write_text(f"merge_method: safe_merge\nbase_model: {base}\nmodels:\n  - model: {good1}\n"
                      f"  - model: {bad}\n{extra}dtype: float32\n{shared}")
    assert main(["merge", str(config), str(tmp_path / "out"), "--quiet"]) != 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_weights_cli_writes_softmax_weights_that_reach_the_merge(variants, tmp_path, capsys) -> None:
    base, paths = variants
    source = tmp_path / "ta.yaml"
    source.write_text(full_config_yaml("task_arithmetic", str(base), [str(p) for p in paths],
                                       "parameters:\n  lambda: 1.0\n"))
    weighted = tmp_path / "weighted.yaml"
    assert main(["weights", str(source), str(weighted), "--scores", "0.9,0.2,0.5", "--temperature", "0.5"]) == 0
    expected = softmax_weights([0.9, 0.2, 0.5], 0.5)
    config = yaml.safe_load(weighted.read_text())
    assert [m["parameters"]["weight"] for m in config["models"]] == pytest.approx(expected)
    assert "softmax(score / 0.5)" in weighted.read_text()
    assert main(["merge", str(weighted), str(tmp_path / "out"), "--quiet"]) == 0
    name = "bert.encoder.layer.1.attention.output.dense.weight"
    tensors = [load_file(p / "model.safetensors")[name] for p in (base, *paths)]
    merged = load_file(tmp_path / "out" / "model.safetensors")[name]
    torch.testing.assert_close(merged, tensors[0] + sum(w * (t - tensors[0]) for w, t in zip(expected, tensors[1:])))
    assert main(["weights", str(source), str(tmp_path / "w2.yaml"), "--scores", "1,2"]) == 2
    assert "gives 2 scores for 3 models" in capsys.readouterr().err


def _dense_weights(base: Path, adapter: Path) -> dict[str, torch.Tensor]:
    """The base with a LoRA adapter merged in by peft (s·B·A added to each adapted weight)."""
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(base)
    return PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().state_dict()


def _merge_shipped_config(name: str, tasks: Sequence[str], tmp_path: Path, monkeypatch) -> tuple[Path, dict]:
    """``merge_configs/<name>`` merged unchanged, from ``tmp_path``, over tiny ``runs/<task>`` adapters: the
    base and the merged tensors."""
    base = save_base(tmp_path / "runs" / "base")
    for seed, task in enumerate(tasks, start=1):
        save_task_adapter(tmp_path / "runs", task, 2, seed)
    monkeypatch.chdir(tmp_path)
    from mergekit.io.tasks import LoaderCache

    LoaderCache().loaders.clear()  # keyed by the relative input paths, which earlier tests' workdirs also used
    assert main(["merge", str(REPO / "merge_configs" / name), "out", "--lora-merge-cache", "cache", "--quiet"]) == 0
    return base, load_file(tmp_path / "out" / "model.safetensors")


@pytest.mark.slow
def test_shipped_negation_config_subtracts_the_unwanted_task_vector(tmp_path, monkeypatch) -> None:
    base, merged = _merge_shipped_config("negation.yaml", ("election_tweets", "rotten_tomatoes"), tmp_path,
                                         monkeypatch)
    keep = _dense_weights(base, tmp_path / "runs" / "election_tweets" / "encoder_adapter")
    unwanted = _dense_weights(base, tmp_path / "runs" / "rotten_tomatoes" / "encoder_adapter")
    base_state = load_file(base / "model.safetensors")
    name = "bert.encoder.layer.1.attention.self.value.weight"
    assert not torch.equal(keep[name], unwanted[name])
    expected = base_state[name] + (keep[name] - base_state[name]) - (unwanted[name] - base_state[name])
    torch.testing.assert_close(merged[name], expected, atol=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_shipped_projection_config_leaves_nothing_in_the_unwanted_adapters_output_subspace(tmp_path, monkeypatch):
    tasks = ("election_tweets", "reuters_r8", "bbc_news", "rotten_tomatoes")  # the last is marked unwanted
    base, merged = _merge_shipped_config("safe_merge_away.yaml", tasks, tmp_path, monkeypatch)
    dense = {task: _dense_weights(base, tmp_path / "runs" / task / "encoder_adapter") for task in tasks}
    base_state = load_file(base / "model.safetensors")
    name = "bert.encoder.layer.1.attention.self.value.weight"
    unwanted = dense["rotten_tomatoes"][name] - base_state[name]
    kept = sum(dense[task][name] - base_state[name] for task in tasks[:3])
    projector = _projector([dense["rotten_tomatoes"][name]], base_state[name])
    expected = base_state[name].double() + 0.3 * (kept.double() - projector @ kept.double())
    torch.testing.assert_close(merged[name].double(), expected, atol=1e-5, rtol=0)
    assert torch.linalg.matrix_rank(unwanted.double(), rtol=1e-5) <= 4  # a LoRA delta: rank ≤ r
    assert (projector @ (merged[name] - base_state[name]).double()).abs().max() < 1e-5
