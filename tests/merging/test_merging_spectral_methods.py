"""The spectral mergekit methods (``tsv``, ``iso_c``, ``iso_cts``, ``wudi``) through stock mergekit: in-memory
state dicts, a merge of saved LoRA adapters that reads their factors and privacy records, and the factor-space
merge (``--as-adapter``)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import yaml
from mergekit.merge_methods.api import merge_state_dicts
from safetensors.torch import load_file

from hf_dpmerge.merging import run as merge_run
from hf_dpmerge.merging.adapters.adapter_merge import merge_shared_a_adapters
from hf_dpmerge.merging.inputs import adapter_weights
from hf_dpmerge.merging.methods.iso import iso_c_merge, iso_cts_merge
from hf_dpmerge.merging.methods.registration import register_methods
from hf_dpmerge.merging.methods.tsv import tsv_merge
from hf_dpmerge.merging.methods.wudi import wudi_merge
from hf_dpmerge.noise.floor import lora_noise_edge, noise_edge
from hf_dpmerge.records.record import PrivacyRecordError
from tests.utils.merging_builders import NOISE_STD_B, lora_config_yaml, save_shared_a_runs

SETTINGS = {  # non-default settings, and the kernel each must reach
    "tsv": ({"lambda": 0.5, "k": 2}, lambda t, e=None: tsv_merge(t, 2, e)),
    "iso_c": ({"lambda": 0.5}, lambda t, e=None: iso_c_merge(t, e)),
    "iso_cts": ({"lambda": 0.5, "common_space_fraction": 0.5}, lambda t, e=None: iso_cts_merge(t, 0.5, e)),
    "wudi": ({"lambda": 0.5, "steps": 20, "lr": 1e-3}, lambda t, e=None: wudi_merge(t, 20, 1e-3, "adam", e)),
}
MATRIX, BIAS = "encoder.layer.0.attention.self.query.weight", "encoder.bias"
EMBEDDING = "embeddings.word_embeddings.weight"


def _state_dicts() -> dict[str, dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    base = {MATRIX: torch.randn(16, 8, generator=generator), BIAS: torch.randn(16, generator=generator),
            EMBEDDING: torch.randn(20, 8, generator=generator)}
    return {"base": base, **{name: {k: v + 0.1 * torch.randn(v.shape, generator=generator) for k, v in base.items()}
                             for name in ("a", "c", "d")}}


@pytest.mark.parametrize("method", sorted(SETTINGS))
def test_each_method_through_merge_state_dicts_is_its_kernel(method: str) -> None:
    """Matrices by the kernel; 1-D tensors and embeddings by task arithmetic as the papers (λ·mean; WUDI keeps its
    start, the sum); the paper's scale λ = 1 by default."""
    register_methods()
    models = _state_dicts()
    parameters, kernel = SETTINGS[method]
    merged = merge_state_dicts(models, method, base="base", parameters=parameters)
    base = models["base"]
    taus = {key: [models[name][key] - base[key] for name in ("a", "c", "d")] for key in base}
    torch.testing.assert_close(merged[MATRIX], base[MATRIX] + 0.5 * kernel(taus[MATRIX]))
    combine = sum if method == "wudi" else (lambda values: sum(values) / len(values))
    for key in (BIAS, EMBEDDING):
        torch.testing.assert_close(merged[key], base[key] + 0.5 * combine(taus[key]))
    default = merge_state_dicts(models, method, base="base")
    assert not torch.equal(default[MATRIX], merged[MATRIX])  # λ = 1 and the paper's settings when none is given


def test_an_in_memory_input_gives_its_noise_floor_as_noise_std() -> None:
    register_methods()
    models = _state_dicts()
    with pytest.raises(PrivacyRecordError, match="in-memory input carries no record.*give the input.s noise_std"):
        merge_state_dicts(models, "tsv", base="base", parameters={"noise_floor": "record"})
    merged = merge_state_dicts(models, "iso_c", base="base",
                               parameters={"noise_floor": "record", "noise_std": {"a": 0.02, "c": 0.0, "d": 0.05}})
    base = models["base"][MATRIX]
    edges = [noise_edge(std**2, (16, 8)) for std in (0.02, 0.0, 0.05)]
    expected = iso_c_merge([models[name][MATRIX] - base for name in ("a", "c", "d")], edges)
    torch.testing.assert_close(merged[MATRIX], base + expected)


def test_unknown_keys_are_refused_before_anything_is_merged(tmp_path: Path) -> None:
    config = {"merge_method": "iso_c", "base_model": "base", "models": [{"model": "a"}],
              "parameters": {"common_space_fraction": 0.5}}
    with pytest.raises(ValueError, match="iso_c: unknown parameter 'common_space_fraction'"):
        merge_run.merge(config, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_shared_a_runs(tmp_path_factory.mktemp("runs"), {"sst2": 2, "mnli": 3, "qnli": 2})


def _factors(runs: Path, name: str) -> list:
    return [adapter_weights(runs / task / "encoder_adapter").factors[name] for task in ("sst2", "mnli", "qnli")]


def test_a_yaml_merge_of_lora_adapters_reads_their_factors_and_their_records_noise(runs: Path, monkeypatch) -> None:
    """mergekit's run_merge on base+adapter inputs with ``noise_floor: record``: each query/value weight is the base
    plus the kernel on the exact factors s·B_i·A truncated at s·e(V_B, A), V_B the record's (AdamW: Σ η_t² = 1e-4)."""
    from mergekit.config import MergeConfiguration
    from mergekit.merge import MergeOptions, run_merge

    register_methods()
    monkeypatch.chdir(runs)
    adapters = [f"./{task}/encoder_adapter" for task in ("sst2", "mnli", "qnli")]
    config = lora_config_yaml("iso_cts", "./base", adapters, "parameters:\n  noise_floor: record\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no dp_noise_stats: the record's formula, warned
        run_merge(MergeConfiguration.model_validate(yaml.safe_load(config)), "merged",
                  MergeOptions(lora_merge_cache="cache", quiet=True))
    merged, base = load_file(runs / "merged" / "model.safetensors"), load_file(runs / "base" / "model.safetensors")
    name = "bert.encoder.layer.0.attention.self.query.weight"
    factors = _factors(runs, name)
    edges = [lora_noise_edge(f.lora_a, f.lora_b, f.scaling, 0.0, NOISE_STD_B**2) for f in factors]
    expected = iso_cts_merge([f.delta_factors() for f in factors], edges=edges)
    assert all(0 < edge < float(torch.linalg.matrix_norm(f.scaling * f.lora_b @ f.lora_a, ord=2))
               for edge, f in zip(edges, factors))  # the floor cuts inside the spectrum
    torch.testing.assert_close(merged[name], base[name] + expected.float(), atol=1e-6, rtol=0)
    untouched = "bert.encoder.layer.0.attention.self.key.weight"
    torch.testing.assert_close(merged[untouched], base[untouched])


@pytest.mark.parametrize(("method", "options"), [
    ("tsv", {"noise_floor": "record"}),
    ("iso_cts", {"common_space_fraction": 0.5}),
    ("wudi", {"solver": "least_squares", "noise_floor": "record"}),
])
def test_spectral_adapters_are_the_dense_spectral_merges_at_adapter_size(runs: Path, tmp_path: Path, method: str,
                                                                         options: dict) -> None:
    """--as-adapter: the merged B' gives s·B'·A = λ·(the kernel on the inputs' factors) in every layer."""
    inputs = [runs / task / "encoder_adapter" for task in ("sst2", "mnli", "qnli")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no dp_noise_stats: the record's formula, warned
        out = merge_shared_a_adapters(inputs, tmp_path / method, method=method, lam=0.7, options=options)
    kernels = {"tsv": tsv_merge, "iso_cts": iso_cts_merge, "wudi": wudi_merge}
    own = {k: v for k, v in options.items() if k != "noise_floor"}
    for name, merged in adapter_weights(out).factors.items():
        factors = _factors(runs, name)
        edges = None if "noise_floor" not in options else [
            lora_noise_edge(f.lora_a, f.lora_b, f.scaling, 0.0, NOISE_STD_B**2) for f in factors]
        expected = 0.7 * kernels[method]([f.delta_factors() for f in factors], edges=edges, **own)
        torch.testing.assert_close(merged.scaling * merged.lora_b.double() @ merged.lora_a.double(), expected,
                                   atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match=f"{method} weighs its inputs itself"):
        merge_shared_a_adapters(inputs, tmp_path / "weighted", method=method, weights=[1.0, 2.0, 1.0])
