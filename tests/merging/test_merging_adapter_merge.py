"""Factor-space merges of shared-A (FFA-LoRA) adapters: the output is a peft adapter equal to the dense merge."""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from mergekit.common import ModelReference
from mergekit.merge_methods.base import TensorEntry
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from hf_dpmerge.cli.main import main
from hf_dpmerge.merging.adapters.adapter_merge import MERGE_RECORD_NAME, merge_shared_a_adapters
from hf_dpmerge.merging.adapters.adapter_merge_config import adapter_merge_arguments
from hf_dpmerge.merging.inputs import NOISE_STD, RECORD_OVERRIDES, adapter_weights
from hf_dpmerge.merging.methods.mergekit_methods import DPAwareMethod
from tests.utils.merging_builders import SHARED_A_SEED as SEED
from tests.utils.merging_builders import lora_config_yaml, save_shared_a_adapter, save_shared_a_runs
from tests.utils.tiny_models import save_tiny_llama, tiny_causal_tokenizer, tiny_tokenizer


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_shared_a_runs(tmp_path_factory.mktemp("runs"), {"sst2": 2, "mnli": 3, "qnli": 2})


def adapters(runs: Path, *tasks: str) -> list[Path]:
    return [runs / task / "encoder_adapter" for task in tasks]


def outputs(model: torch.nn.Module) -> torch.Tensor:
    """The logits and the last hidden states (the tiny head's logits are ~1e-2, the hidden states ~1)."""
    batch = tiny_tokenizer()(["the film was a delight", "markets rallied as oil prices fell"], return_tensors="pt",
                             padding=True)
    with torch.no_grad():
        output = model.eval()(**batch, output_hidden_states=True)
    return torch.cat([output.logits.flatten(), output.hidden_states[-1].flatten()])


def dense_merge(base_dir: Path, inputs: list[Path], weights: list[float], lam: float) -> torch.nn.Module:
    """The base with λ·Σ_i w_i·s·B_i·A added to every LoRA-targeted weight."""
    model = AutoModelForSequenceClassification.from_pretrained(base_dir)
    state = model.state_dict()
    with torch.no_grad():
        for directory, weight in zip(inputs, weights):
            for name, factor in adapter_weights(directory).factors.items():
                state[name].add_(lam * weight * factor.scaling * factor.lora_b @ factor.lora_a)
    return model


def test_task_arithmetic_adapter_gives_the_dense_merges_logits_through_stock_peft(runs: Path, tmp_path: Path):
    inputs, weights, lam = adapters(runs, "sst2", "mnli", "qnli"), [0.5, 1.0, 0.8], 0.7
    out = merge_shared_a_adapters(inputs, tmp_path / "merged", lam=lam, weights=weights,
                                  base_model=str(runs / "base"))
    base = AutoModelForSequenceClassification.from_pretrained(runs / "base")
    merged = PeftModel.from_pretrained(base, out)
    expected = outputs(dense_merge(runs / "base", inputs, weights, lam))
    torch.testing.assert_close(outputs(merged), expected, atol=1e-5, rtol=0)
    unmerged = outputs(AutoModelForSequenceClassification.from_pretrained(runs / "base"))
    assert (expected - unmerged).abs().max() > 1e-3  # the merge moved the logits: the comparison has teeth
    assert sum(t.numel() for t in adapter_weights(out).tensors.values()) == sum(
        t.numel() for t in adapter_weights(inputs[0]).tensors.values())  # same rank, same size
    readme = (out / "README.md").read_text()
    assert all(f"- {task} (weight" in readme for task in ("sst2", "mnli", "qnli")) and "(ε = 8, δ = 1e-05)-DP" in readme
    released = "".join((out / name).read_text() for name in ("README.md", MERGE_RECORD_NAME, "mergekit_config.yml"))
    assert str(tmp_path) not in released and str(runs) not in released  # names, never this machine's paths


def test_a_merged_adapter_merges_again_as_if_all_were_merged_at_once(runs: Path, tmp_path: Path):
    first = merge_shared_a_adapters(adapters(runs, "sst2", "mnli"), tmp_path / "pair", weights=[0.5, 0.7])
    again = merge_shared_a_adapters([first, *adapters(runs, "qnli")], tmp_path / "again", weights=[1.0, 0.9])
    at_once = merge_shared_a_adapters(adapters(runs, "sst2", "mnli", "qnli"), tmp_path / "once",
                                      weights=[0.5, 0.7, 0.9])
    again_tensors, once_tensors = adapter_weights(again).tensors, adapter_weights(at_once).tensors
    assert again_tensors.keys() == once_tensors.keys()
    for key, tensor in once_tensors.items():
        torch.testing.assert_close(again_tensors[key], tensor, atol=1e-7, rtol=1e-6)
    records = json.loads((again / MERGE_RECORD_NAME).read_text())["records"]
    assert set(records) == {"sst2", "mnli", "qnli"}  # the card covers all three, by task
    with pytest.raises(ValueError, match="itself a merged adapter"):
        merge_shared_a_adapters([first, *adapters(runs, "qnli")], tmp_path / "dp", method="dp_aware")


@pytest.mark.parametrize("a_seed, message", [(SEED + 1, "do not share their LoRA A"),
                                             (None, "its LoRA A was trained.*--lora_freeze_a true")])
def test_adapters_without_the_shared_a_are_refused_and_nothing_is_written(
    runs: Path, tmp_path: Path, a_seed: int | None, message: str
):
    other = save_shared_a_adapter(tmp_path / "other", "rte", 2, 9, a_seed=a_seed)
    with pytest.raises(ValueError, match=message):
        merge_shared_a_adapters([*adapters(runs, "sst2"), other], tmp_path / "merged")
    assert not (tmp_path / "merged").exists()


def test_a_record_that_does_not_match_the_saved_a_is_refused(runs: Path, tmp_path: Path):
    forged = tmp_path / "forged"
    shutil.copytree(save_shared_a_adapter(tmp_path / "trained", "rte", 2, 9, a_seed=None), forged)
    shutil.copy(adapters(runs, "sst2")[0] / "dp_privacy.json", forged / "dp_privacy.json")
    with pytest.raises(ValueError, match="do not match its record's lora_a fingerprint"):
        merge_shared_a_adapters([*adapters(runs, "mnli"), forged], tmp_path / "merged")


def test_dp_aware_in_factor_space_equals_the_dense_dp_aware_merge(runs: Path, tmp_path: Path):
    inputs, weights, lam = adapters(runs, "sst2", "mnli", "qnli"), [1.0, 0.6, 0.8], 0.9
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no dp_noise_stats: the record's formula (warned) on both paths
        out = merge_shared_a_adapters(inputs, tmp_path / "dp", method="dp_aware", lam=lam, weights=weights)
        plain = merge_shared_a_adapters(inputs, tmp_path / "ta", lam=lam, weights=weights)
        references = [ModelReference.parse(f"{runs / 'base'}+{d}") for d in inputs]
        parameters = {"lambda": lam, "consensus": "none", "weighting": "task_arithmetic", "noise": "record",
                      "shrinkage": "scale",
                      "allow_non_private": False, "weight": dict(zip(references, weights)),
                      **{key: dict.fromkeys(references) for key in (*RECORD_OVERRIDES, NOISE_STD)}}
        base_state = AutoModelForSequenceClassification.from_pretrained(runs / "base").state_dict()
        merged, task_arithmetic = adapter_weights(out).factors, adapter_weights(plain).factors
        for name, factor in merged.items():
            entries = tuple(TensorEntry(ref, base_state[name] + f.scaling * f.lora_b @ f.lora_a)
                            for ref, f in ((r, adapter_weights(d).factors[name]) for r, d in zip(references, inputs)))
            dense = DPAwareMethod().merge(name, base_state[name], entries, parameters)
            factor_space = base_state[name] + factor.scaling * factor.lora_b @ factor.lora_a
            torch.testing.assert_close(factor_space, dense, atol=1e-6, rtol=0)
            assert not torch.allclose(factor.lora_b, task_arithmetic[name].lora_b, atol=1e-3)  # SURE acted


def test_cli_as_adapter_reads_the_merge_yaml(runs: Path, tmp_path: Path, capsys):
    base, inputs = str(runs / "base"), [str(d) for d in adapters(runs, "sst2", "mnli")]
    config = tmp_path / "merge.yaml"
    config.write_text(lora_config_yaml("task_arithmetic", base, inputs, "parameters:\n  lambda: 0.8\n",
                                       "    parameters:\n      weight: 0.5\n"))
    assert main(["merge", str(config), str(tmp_path / "cli"), "--as-adapter"]) == 0
    api = merge_shared_a_adapters(inputs, tmp_path / "api", lam=0.8, weights=[0.5, 0.5])
    for key, tensor in adapter_weights(api).tensors.items():
        assert torch.equal(adapter_weights(tmp_path / "cli").tensors[key], tensor)
    refused = "parameters:\n  lambda: 1\n  consensus: precision_sign\n"
    config.write_text(lora_config_yaml("dp_aware", base, inputs, refused))
    assert main(["merge", str(config), str(tmp_path / "refused"), "--as-adapter"]) == 2
    assert "dp_aware parameter consensus='precision_sign' acts on dense coordinates" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()


def test_cauchy_poe_adapter_gives_the_dense_cauchy_poe_merges_logits_through_stock_peft(runs: Path, tmp_path: Path):
    """The fixed point of the τ_i = s·B_i·A lies in A's row space: the adapter is the dense merge, at adapter size,
    from mergekit-yaml's config through hf-dpmerge merge --as-adapter."""
    from hf_dpmerge.merging.methods.cauchy_poe import cauchy_poe_merge

    inputs, lam = adapters(runs, "sst2", "mnli", "qnli"), 0.8
    options = {"tol": 1e-2, "jitter": 1e-3, "max_iter": 500, "conv_tol": 1e-9, "layers": "reference"}
    (tmp_path / "poe.yaml").write_text(lora_config_yaml(
        "cauchy_poe", str(runs / "base"), [str(d) for d in inputs], "parameters:\n  lambda: 0.8\n  conv_tol: 1e-9\n"))
    assert main(["merge", str(tmp_path / "poe.yaml"), str(tmp_path / "merged"), "--as-adapter"]) == 0
    dense = AutoModelForSequenceClassification.from_pretrained(runs / "base")
    state = dense.state_dict()
    with torch.no_grad():
        for key in adapter_weights(inputs[0]).factors:  # a factor is named after the weight it changes
            name = key
            taus = [adapter_weights(d).factors[name] for d in inputs]
            finetuned = [state[key].double() + f.scaling * f.lora_b.double() @ f.lora_a.double() for f in taus]
            state[key].copy_(cauchy_poe_merge(state[key].double(), finetuned, lam=lam, name=name, **options))
    merged = PeftModel.from_pretrained(AutoModelForSequenceClassification.from_pretrained(runs / "base"),
                                       tmp_path / "merged")
    expected = outputs(dense)
    torch.testing.assert_close(outputs(merged), expected, atol=1e-5, rtol=0)
    task_arithmetic = outputs(dense_merge(runs / "base", inputs, [1.0, 1.0, 1.0], lam))
    assert (expected - task_arithmetic).abs().max() > 1e-4  # PoE is not the mean: the comparison has teeth
    with pytest.raises(ValueError, match="cauchy_poe weighs its inputs itself"):
        merge_shared_a_adapters(inputs, tmp_path / "weighted", method="cauchy_poe", weights=[1.0, 2.0, 1.0])


REPO = Path(__file__).resolve().parents[2]
PACKAGED = sorted(path.stem for path in (REPO / "merge_configs").glob("*.yaml"))
NOT_EXACT = {  # packaged config -> the parameter the refusal names and why no merged adapter can equal the dense merge
    "ties": ("merge_method 'ties'", "sign election and magnitude trimming pick dense coordinates"),
    "causal_ties": ("merge_method 'ties'", "sign election and magnitude trimming pick dense coordinates"),
    "safe_merge": ("percentile=50.0", "its entry mask keeps dense coordinates of each ΔW, not a change of B"),
    "wudi": ("solver='adam'", "Adam's per-coordinate steps on the dense ΔW leave the shared A's row space"),
    "emr": ("merge_method 'emr'", "the elected τ_uni takes each dense coordinate from one task: not low-rank"),
    "quickstart": ("merge_method 'emr'", "the quick start merges with emr"),
}


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packaged configs' folders: runs/ (tiny BERT, the quickstart's four tasks and own_data.yaml's two runs) and
    runs_causal/ (tiny Llama, two tasks), every adapter sharing its frozen A."""
    root = tmp_path_factory.mktemp("layout")
    save_shared_a_runs(root / "runs", {"rotten_tomatoes": 2, "election_tweets": 3, "reuters_r8": 8, "bbc_news": 5,
                                       "notes": 2, "clinic": 3})
    save_tiny_llama(root / "runs_causal" / "base")
    for seed, task in enumerate(("rotten_tomatoes", "election_tweets"), start=1):
        save_shared_a_adapter(root / "runs_causal", task, 2, seed, causal=True)
    return root


def packaged_logits(root: Path, name: str, dense: Path, adapter: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(the dense merge's, the merged adapter's through stock peft) logits and last hidden states; an encoder
    merge gets the base's head on both sides (the dense root carries no head)."""
    if name.startswith("causal_"):
        base = root / "runs_causal" / "base"
        batch = tiny_causal_tokenizer()(["the film was a delight"], return_tensors="pt")

        def run(model: torch.nn.Module) -> torch.Tensor:
            with torch.no_grad():
                output = model.eval()(**batch, output_hidden_states=True)
            return torch.cat([output.logits.flatten(), output.hidden_states[-1].flatten()])

        return (run(AutoModelForCausalLM.from_pretrained(dense)),
                run(PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)))
    base = root / "runs" / "base"
    model = AutoModelForSequenceClassification.from_pretrained(base)
    model.load_state_dict(load_file(dense / "model.safetensors"), strict=False)
    return outputs(model), outputs(PeftModel.from_pretrained(AutoModelForSequenceClassification.from_pretrained(base),
                                                             adapter))


@pytest.mark.parametrize("name", PACKAGED)
def test_every_packaged_config_merges_as_adapter_to_the_dense_merges_logits(layout: Path, name: str, monkeypatch,
                                                                             capsys):
    """The packaged YAML unchanged, with the documented mergekit flags: ``--as-adapter`` ignores them with a note
    and its adapter equals ``hf-dpmerge merge``'s dense model within 1e-5; configs no adapter can equal are
    refused naming the parameter, writing nothing."""
    monkeypatch.chdir(layout)
    config = str(REPO / "merge_configs" / f"{name}.yaml")
    flags = ["--lora-merge-cache", "lora_cache"]
    code = main(["merge", config, f"adapters/{name}", "--as-adapter", *flags])
    err = capsys.readouterr().err
    if name in NOT_EXACT:
        assert code == 2 and NOT_EXACT[name][0] in err and "use the dense merge" in err, err
        assert not (layout / "adapters" / name).exists()
        return
    assert code == 0, err
    assert "ignores --lora-merge-cache lora_cache" in err
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no dp_noise_stats: the record's formula (warned) on both paths
        assert main(["merge", config, f"dense/{name}", *flags, "--quiet"]) == 0
    dense, adapter = packaged_logits(layout, name, layout / "dense" / name, layout / "adapters" / name)
    torch.testing.assert_close(adapter, dense, atol=1e-5, rtol=0)
    unmerged, _ = packaged_logits(layout, name, layout / ("runs_causal" if "causal" in name else "runs") / "base",
                                  layout / "adapters" / name)
    assert (dense - unmerged).abs().max() > 1e-4  # the merge moved the outputs: the comparison has teeth


def test_as_adapter_settings_are_honoured_or_refused_by_name(runs: Path, tmp_path: Path):
    """A global weight is every model's, ``normalize`` divides by Σw as mergekit does, ``safe_merge`` at
    percentile 100 is task arithmetic of the useful inputs; layer-varying or dense-only values are refused."""
    inputs = [f"{runs / 'base'}+{d}" for d in adapters(runs, "sst2", "mnli")]

    def config(method: str, parameters: dict, per_model: list[dict] | None = None) -> dict:
        return {"merge_method": method, "base_model": str(runs / "base"), "parameters": parameters,
                "models": [{"model": m, "parameters": p} for m, p in zip(inputs, per_model or [{}, {}])]}

    arguments = adapter_merge_arguments(config("task_arithmetic", {"weight": 2.0, "lambda": 0.5}))
    assert arguments["weights"] == [2.0, 2.0] and arguments["lam"] == 0.5
    normalized = adapter_merge_arguments(config("task_arithmetic", {"normalize": True}, [{"weight": 1}, {"weight": 3}]))
    assert normalized["weights"] == [0.25, 0.75] and normalized["lam"] == 1.0  # mergekit's task_arithmetic λ default
    safe = adapter_merge_arguments(config("safe_merge", {"percentile": 100, "scale": 0.7},
                                          [{"weight": 0.5}, {"unwanted": True}]))
    kept = merge_shared_a_adapters(out_dir=tmp_path / "safe", **safe)
    plain = merge_shared_a_adapters(adapters(runs, "sst2"), tmp_path / "plain", lam=0.7, weights=[0.5])
    for key, tensor in adapter_weights(plain).tensors.items():
        torch.testing.assert_close(adapter_weights(kept).tensors[key], tensor)
    refusals = {
        "weight=[1.0, 0.5] varies across layers": config("task_arithmetic", {"weight": [1.0, 0.5]}),
        "dp_aware parameter weighting='random_effects' acts on dense coordinates": config(
            "dp_aware", {"lambda": 1.0, "weighting": "random_effects"}),
        "safe_merge parameter percentile=50.0 masks dense coordinates": config(
            "safe_merge", {}, [{}, {"unwanted": True}]),
        "unknown cauchy_poe parameter ['density']": config("cauchy_poe", {"lambda": 1.0, "density": 0.5}),
    }
    for message, refused in refusals.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            adapter_merge_arguments(refused)
