"""hf_dpmerge only adds methods to mergekit: stock methods behave as without it, and our methods work through
mergekit's Python APIs (``merge_state_dicts``, ``run_merge``) as through ``mergekit-yaml``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mergekit.merge_methods.api import merge_state_dicts

from hf_dpmerge.cli.main import main
from hf_dpmerge.merging.methods.registration import register_methods
from hf_dpmerge.records.record import PrivacyRecordError
from tests.utils.merging_builders import full_config_yaml, save_base, save_variant

REPO = Path(__file__).resolve().parents[2]
# mergekit-yaml's own entry point, in a process whose start-up hook is this repository's (or removed)
_MERGEKIT_YAML = """
import sys
hooked = [f for f in sys.meta_path if type(f).__module__ == "_hf_dpmerge_mergekit"]
if sys.argv[1] == "without":
    sys.meta_path[:] = [f for f in sys.meta_path if f not in hooked]
elif not hooked:
    sys.exit("the hf_dpmerge start-up hook is not installed in this interpreter")
sys.argv = ["mergekit-yaml", *sys.argv[2:]]
from mergekit.scripts.run_yaml import main
main()
"""


def _mergekit_yaml(workdir: Path, hook: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO / "mergekit_hook"), str(REPO)])}
    return subprocess.run([sys.executable, "-c", _MERGEKIT_YAML, hook, *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=300)


def _files(directory: Path) -> dict[str, bytes]:
    """Every output file's bytes; the model card's lines sorted, since mergekit lists the merged models from a set
    (its order follows the process's hash seed)."""
    files = {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}
    if "README.md" in files:
        files["README.md"] = b"\n".join(sorted(files["README.md"].splitlines()))
    return files


@pytest.fixture(scope="module")
def variants(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("stock")
    save_base(root / "base")
    for seed in (1, 2):
        save_variant(root / "base", root / f"v{seed}", seed)
    (root / "ties.yaml").write_text(full_config_yaml("ties", "./base", ["./v1", "./v2"],
                                                     per_model="    parameters: {weight: 1.0, density: 0.5}\n"))
    return root


@pytest.mark.slow
def test_stock_ties_behaves_the_same_with_and_without_hf_dpmerge(variants: Path) -> None:
    outputs = {}
    for hook in ("with", "without"):
        out = variants / hook / "merged"  # one name: mergekit titles its card after it
        out.mkdir(parents=True)
        (out / "notes.txt").write_text("a file already in the output directory")
        done = _mergekit_yaml(variants, hook, "ties.yaml", f"{hook}/merged", "--quiet")
        assert done.returncode == 0, done.stderr[-3000:]
        assert "hf_dpmerge" not in done.stderr
        outputs[hook] = _files(out)
    assert outputs["with"] == outputs["without"]  # same files, same bytes, notes.txt kept by both
    assert outputs["with"]["notes.txt"] == b"a file already in the output directory"


def test_the_start_up_hook_leaves_run_merge_alone() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import mergekit.merge as m, mergekit.merge_methods as mm; "
         "print(m.run_merge.__module__, "
         "sorted({'cauchy_poe', 'dp_aware'} & {x.spec.name for x in mm.registered_methods()}))"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "mergekit_hook"), str(REPO)])},
        capture_output=True, text=True, timeout=120,
    )
    assert done.stdout.split() == ["mergekit.merge", "['cauchy_poe',", "'dp_aware']"], done.stderr[-2000:]


def _state_dicts() -> dict[str, dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    base = {"w": torch.randn(16, 8, generator=generator), "b": torch.randn(16, generator=generator)}
    return {"base": base, **{name: {k: v + 0.1 * torch.randn(v.shape, generator=generator) for k, v in base.items()}
                             for name in ("a", "c")}}


def test_cauchy_poe_through_merge_state_dicts() -> None:
    register_methods()
    models = _state_dicts()
    with pytest.raises(TypeError, match="Missing required parameter lambda for cauchy_poe"):
        merge_state_dicts(models, "cauchy_poe", base="base")  # no default scale: a misspelt block must not merge
    merged = merge_state_dicts(models, "cauchy_poe", base="base", parameters={"lambda": 1.0})
    assert set(merged) == {"w", "b"}
    assert all(bool(torch.isfinite(t).all()) for t in merged.values())
    assert not torch.equal(merged["w"], models["base"]["w"])


def test_dp_aware_through_merge_state_dicts_needs_the_inputs_privacy_to_be_stated() -> None:
    register_methods()
    models = _state_dicts()
    with pytest.raises(PrivacyRecordError, match="in-memory input carries no record.*`allow_non_private: true`"):
        merge_state_dicts(models, "dp_aware", base="base", parameters={"lambda": 1.0})
    with pytest.raises(PrivacyRecordError, match="give the input.s noise_std"):
        merge_state_dicts(models, "dp_aware", base="base", parameters={"allow_non_private": True, "lambda": 1.0})
    stated = merge_state_dicts(models, "dp_aware", base="base", parameters={
        "allow_non_private": True, "noise_std": {"a": 0.0, "c": 0.0}, "lambda": 1.0})
    arithmetic = merge_state_dicts(models, "task_arithmetic", base="base", parameters={"weight": 1.0})
    for name in ("w", "b"):  # zero noise: dp_aware is task arithmetic (docs/design.md §6)
        torch.testing.assert_close(stated[name], arithmetic[name])
    with pytest.raises(ValueError, match="noise: estimate"):  # refused: it treats a dense task vector as noise
        merge_state_dicts(models, "dp_aware", base="base",
                          parameters={"allow_non_private": True, "noise": "estimate", "lambda": 1.0})


def test_dp_aware_through_run_merge_refuses_a_non_private_input_unless_allowed(variants: Path, monkeypatch) -> None:
    from mergekit.config import MergeConfiguration
    from mergekit.merge import MergeOptions, run_merge

    from hf_dpmerge.records.record import PrivacyRecord

    register_methods()
    monkeypatch.chdir(variants)
    record = PrivacyRecord.load(variants / "v2")
    record.dp, record.epsilon, record.delta = False, float("inf"), 0.0
    record.save(variants / "v2")

    def merge(extra: str, out: str) -> None:
        import yaml

        config = full_config_yaml("dp_aware", "./base", ["./v1", "./v2"], parameters=extra)
        run_merge(MergeConfiguration.model_validate(yaml.safe_load(config)), out, MergeOptions(quiet=True))

    with pytest.raises(PrivacyRecordError, match=r"input \./v2 is not shown to be differentially private"):
        merge("parameters:\n  lambda: 1.0\n", "refused")
    merge("parameters:\n  lambda: 1.0\n  allow_non_private: true\n", "allowed")
    assert (variants / "allowed" / "model.safetensors").is_file()


@pytest.mark.parametrize("method", ["cauchy_poe", "dp_aware"])
def test_a_misspelt_parameters_block_fails_instead_of_merging_at_lambda_one(variants: Path, monkeypatch,
                                                                            method: str) -> None:
    """mergekit drops the unknown ``paramters:`` key; with no default scale our methods then refuse to merge
    (stock ``mergekit-yaml``/``run_merge`` path), where a default λ = 1 would have doubled a λ = 0.5 delta."""
    import yaml
    from mergekit.config import MergeConfiguration
    from mergekit.merge import MergeOptions, run_merge

    register_methods()
    monkeypatch.chdir(variants)
    config = full_config_yaml(method, "./base", ["./v1", "./v2"], parameters="paramters:\n  lambda: 0.5\n")
    with pytest.raises(RuntimeError, match="Missing required parameter lambda for bert"):
        run_merge(MergeConfiguration.model_validate(yaml.safe_load(config)), "typo", MergeOptions(quiet=True))


def test_list_methods_names_ours_and_mergekits(capsys) -> None:
    assert main(["merge", "--list-methods"]) == 0
    lines = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()}
    assert {lines[m] for m in ("dp_aware", "cauchy_poe", "tsv", "iso_c", "iso_cts", "wudi")} == {"hf_dpmerge"}
    assert lines["ties"] == lines["task_arithmetic"] == "mergekit"
