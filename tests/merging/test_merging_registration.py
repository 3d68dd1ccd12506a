"""mergekit integration: the start-up hook, method registration and the guarded run_merge."""

from __future__ import annotations

import importlib.metadata
import os
import pkgutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from hf_dpmerge.merging.registration import guard_run_merge

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
        "print(sorted({'cauchy_poe', 'dp_aware'} & {x.spec.name for x in m.registered_methods()}), "
        "getattr(mergekit.merge.run_merge, '__hf_dpmerge_guarded__', False))"
    )
    # registered, and mergekit's own run_merge left alone (hf-dpmerge merge guards it in its own process)
    assert result.stdout.split() == ["['cauchy_poe',", "'dp_aware']", "False"], result.stderr[-2000:]


def _config(method: str) -> SimpleNamespace:
    return SimpleNamespace(merge_method=method, models=[], slices=None, modules=None, parameters=None,
                           base_model=None, referenced_models=lambda: [])


def _failing_merge(config: SimpleNamespace, out_path: str, options: SimpleNamespace) -> None:
    Path(out_path).mkdir(exist_ok=True)
    (Path(out_path) / "model-00001-of-00002.safetensors").write_text("partial")
    raise RuntimeError("boom")


@pytest.mark.parametrize(("method", "prepare", "left"), [
    ("dp_aware", False, None),     # not there before: still not there
    ("cauchy_poe", True, []),      # existed empty: still empty
    ("ties", False, None),         # mergekit's own methods are written atomically too
])
def test_failed_merge_leaves_no_partial_output(tmp_path: Path, method: str, prepare: bool,
                                               left: list[str] | None) -> None:
    out = tmp_path / "out"
    if prepare:
        out.mkdir()
    options = SimpleNamespace(lora_merge_cache=None, write_model_card=True)
    with pytest.raises(RuntimeError, match="boom"):
        guard_run_merge(_failing_merge)(_config(method), str(out), options=options)
    assert (sorted(p.name for p in out.iterdir()) if out.exists() else None) == left
    assert [p.name for p in tmp_path.iterdir()] == (["out"] if prepare else [])  # no scratch left


def test_guard_is_applied_once() -> None:
    guarded = guard_run_merge(_failing_merge)
    assert guard_run_merge(guarded) is guarded


def test_kernels_via_mergekit_api_name_the_tensor_of_a_nan_input() -> None:
    import torch
    from mergekit.merge_methods import get, merge_tensors

    from hf_dpmerge.merging.dp_aware import dp_aware_merge

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
                      name="encoder.layer.0.query.weight")
