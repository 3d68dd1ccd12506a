"""mergekit integration: the start-up hook, method registration, and the one merge entry point (merging/run.py)."""

from __future__ import annotations

import importlib.metadata
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_dpmerge.merging import run as merge_run

REPO = Path(__file__).resolve().parents[2]
HOOK_FILES = ("_hf_dpmerge_mergekit.py", "_hf_dpmerge_mergekit.pth", "_hf_dpmerge_mergekit.start")


def _python(code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_installed_hook_files_match_the_repository() -> None:
    files = importlib.metadata.files("hf_dpmerge") or []
    installed = {Path(str(f)).name: f for f in files if Path(str(f)).name in HOOK_FILES}
    assert sorted(installed) == sorted(HOOK_FILES), "reinstall hf_dpmerge (pip install -e .)"
    for name, file in installed.items():
        assert Path(file.locate()).read_text() == (REPO / "mergekit_hook" / name).read_text(), name
    assert callable(pkgutil.resolve_name((REPO / "mergekit_hook" / HOOK_FILES[2]).read_text().strip()))


def test_start_up_hook_imports_nothing_heavy() -> None:
    """Every Python start-up runs the hook; it may only install an import hook, never import torch, mergekit,
    transformers or hf_dpmerge itself (its cost is a benchmark's business, not a timed unit test's)."""
    result = _python("import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in "
                     "('torch', 'mergekit', 'hf_dpmerge', 'transformers')))", "-X", "importtime")
    assert result.stdout.strip() == "[]"
    assert any(line.rstrip().endswith("_hf_dpmerge_mergekit") for line in result.stderr.splitlines())


@pytest.mark.slow
def test_importing_mergekit_registers_the_methods_in_a_fresh_process() -> None:
    result = _python(
        "import mergekit.merge, mergekit.merge_methods as m; "
        "import mergekit.scripts.run_yaml as y; "
        "print(sorted({'cauchy_poe', 'dp_aware'} & {x.spec.name for x in m.registered_methods()}), "
        "y.run_merge is mergekit.merge.run_merge, mergekit.merge.run_merge.__module__)"
    )
    # registered, and mergekit's own run_merge left alone (nothing of mergekit is patched)
    assert result.stdout.split() == ["['cauchy_poe',", "'dp_aware']", "True", "mergekit.merge"], result.stderr[-2000:]


def _config(method: str) -> dict:
    return {"merge_method": method, "base_model": "base", "models": [{"model": "a", "parameters": {"weight": 1.0}}],
            "parameters": {"lambda": 1.0}}


def _failing_merge(config, out_path: str, options, config_source: str) -> None:
    Path(out_path).mkdir(exist_ok=True)
    (Path(out_path) / "model-00001-of-00002.safetensors").write_text("partial")
    raise RuntimeError("boom")


@pytest.mark.parametrize(("method", "prepare", "left"), [
    ("linear", False, None),       # not there before: still not there
    ("ties", True, []),            # existed empty: still empty (mergekit's own methods are written atomically too)
])
def test_failed_merge_leaves_no_partial_output(tmp_path: Path, monkeypatch, method: str, prepare: bool,
                                               left: list[str] | None) -> None:
    out = tmp_path / "out"
    if prepare:
        out.mkdir()
    monkeypatch.setattr(merge_run, "run_merge", _failing_merge)
    with pytest.raises(RuntimeError, match="boom"):
        merge_run.merge(_config(method), out)
    assert (sorted(p.name for p in out.iterdir()) if out.exists() else None) == left
    assert [p.name for p in tmp_path.iterdir()] == (["out"] if prepare else [])  # no scratch left


def test_a_misspelt_key_is_refused_before_mergekit_runs(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(merge_run, "run_merge", _failing_merge)
    config = {**_config("linear"), "paramters": {"lambda": 0.5}}
    with pytest.raises(ValueError, match=r"unknown key 'paramters' \(did you mean 'parameters'\?\)"):
        merge_run.merge(config, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_kernels_via_mergekit_api_name_the_tensor_of_a_nan_input() -> None:
    import torch
    from mergekit.merge_methods import get, merge_tensors

    from hf_dpmerge.merging.methods.dp_aware import dp_aware_merge

    generator = torch.Generator().manual_seed(0)
    base = torch.randn(6, 4, generator=generator)
    inputs = [base + torch.randn(6, 4, generator=generator) for _ in range(2)]
    merged = merge_tensors([base, *inputs], "dp_aware", base_index=0, ids=["base", "a", "b"],
                           parameters={"noise_std": [0.1, 0.0], "lambda": 0.5, "allow_non_private": True})
    torch.testing.assert_close(merged, dp_aware_merge(base, inputs, [0.01, 0.0], weights=[1.0, 1.0], lam=0.5))
    assert get("cauchy_poe").spec.reference_url == "https://arxiv.org/abs/2607.01689"
    broken = inputs[1].clone()
    broken[2, 1] = float("nan")
    with pytest.raises(ValueError, match=r"encoder.layer.0.query.weight: input b holds NaN"):
        merge_tensors([base, inputs[0], broken], "cauchy_poe", base_index=0, ids=["base", "a", "b"],
                      name="encoder.layer.0.query.weight", parameters={"lambda": 1.0})


def test_a_second_merge_in_one_process_reads_its_own_inputs(tmp_path: Path, monkeypatch) -> None:
    """mergekit keeps tensor loaders per process, keyed by the path as written: the same relative ``./model`` in
    another working directory is another model, and merge() must read it."""
    from safetensors.torch import load_file

    from tests.utils.tiny_models import save_tiny_bert

    config = {"merge_method": "linear", "dtype": "float32",
              "models": [{"model": "./model", "parameters": {"weight": 1.0}}]}
    for seed in (0, 1):
        workdir = tmp_path / f"work{seed}"
        save_tiny_bert(workdir / "model", seed=seed)
        monkeypatch.chdir(workdir)
        merge_run.merge(config, workdir / "merged")
        merged, source = (load_file(d / "model.safetensors") for d in (workdir / "merged", workdir / "model"))
        key = "bert.encoder.layer.0.attention.self.query.weight"
        assert torch.equal(merged[key], source[key]), seed  # seed 1 read seed 0's tensors before the fix
