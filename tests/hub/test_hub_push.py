"""`hf-dpmerge push` end to end through the CLI, against a loopback Hub (tests/utils/hub_helpers.py)."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
import types
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from safetensors.torch import load as load_safetensors_bytes
from safetensors.torch import load_file, save_file

from hf_dpmerge.cli import main as cli_main
from hf_dpmerge.records.fingerprint import adapter_fingerprint
from hf_dpmerge.records.record import PrivacyRecord
from hf_dpmerge.records.release_files import is_release_file
from hf_dpmerge.records.selection_record import SelectionRecord
from tests.utils.tiny_models import save_tiny_bert

REPO = "alice/dp-merged"
MERGE_YAML = """\
merge_method: task_arithmetic
base_model: runs/base
models:
  - model: runs/base+runs/alpha/adapter_encoder
    parameters: {weight: 1.0}
  - model: runs/base+runs/beta/adapter_encoder
    parameters: {weight: 1.0}
dtype: float32
"""
# the shape `hf-dpmerge evaluate` writes (hf_dpmerge.analysis.evaluation_report), with beta's interference missing
EVAL = {
    "tasks": {
        "alpha": {"metric": "accuracy", "epsilon": 2.5, "floor": 0.85, "individual": 0.81, "merged": 0.79,
                  "retention": 0.975, "interference": 0.02, "num_examples": 100},
        "beta": {"metric": "macro_f1", "epsilon": 7.75, "floor": 0.44, "individual": 0.64, "merged": 0.6,
                 "retention": 0.9375, "num_examples": 60},
    },
    "average": {"individual": 0.725, "merged": 0.695, "retention": 0.956, "interference": None},
    "metrics": {"alpha": {"individual": {"accuracy": 0.81}, "merged": {"accuracy": 0.79}}},
    "deltas": {"alpha": 1e-05, "beta": 1e-05},
    "max_epsilon": 7.75,
    "merged_model": "merged",
    "base_model": "runs/base",
    "definitions": {"retention": "merged / individual (primary metric; null when individual <= 0)"},
}
TASKS = {"alpha": (2, 2.5, 1234, ["negative", "positive"]), "beta": (3, 7.75, 5678, None)}


@pytest.fixture(scope="module")
def release(tmp_path_factory, make_record, lora_model):
    """runs/<task>/adapter/ for two tasks with different label counts, a merged dir, an eval JSON."""
    root = tmp_path_factory.mktemp("release")
    runs = root / "runs"
    for seed, (task, (num_labels, eps, n, labels)) in enumerate(TASKS.items()):
        peft_model = lora_model("classifier", seed=seed, num_labels=num_labels, r=2, modules_to_save=None)
        adapter = runs / task / "adapter"
        peft_model.save_pretrained(adapter)
        make_record(
            task, eps, accountant="prv", num_samples=n, steps=300, noise_multiplier=1.1,
            effective_noise_multiplier=1.1, base_model="runs/base", base_model_hash="sha256:" + "ab" * 32,
            extra={"label_names": labels} if labels else {},
        ).save(adapter)
    merged = save_tiny_bert(root / "merged")
    (merged / "mergekit_config.yml").write_text(MERGE_YAML)
    (merged / "README.md").write_text("---\ntags: [mergekit]\n---\nmergekit's own card\n")
    eval_json = root / "eval.json"
    eval_json.write_text(json.dumps(EVAL))
    return types.SimpleNamespace(root=root, runs=runs, merged=merged, eval_json=eval_json)


@pytest.fixture
def cli(monkeypatch):
    """``hf_dpmerge.cli.main.main``, with a stand-in for any other verb module not written yet."""
    for verb, module_name in cli_main.VERBS.items():
        if verb == "push":
            continue
        try:
            importlib.import_module(module_name)
        except ModuleNotFoundError:
            stub = types.ModuleType(module_name, f"{verb} (not built yet)")
            stub.add_arguments = lambda parser: None
            stub.run = lambda args: 0
            monkeypatch.setitem(sys.modules, module_name, stub)
    return cli_main.main


def _push_args(release, *extra: str) -> list[str]:
    return ["push", str(release.merged), "--runs", str(release.runs), "--tasks", "alpha,beta", *extra]


# ---------------------------------------------------------------------------------------------- upload


def test_push_uploads_private_repo_with_card_heads_and_records(release, cli, loopback_hub, capsys):
    rc = cli(_push_args(release, "--repo_id", REPO, "--eval_json", str(release.eval_json)))
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert loopback_hub.unhandled == [] and loopback_hub.auth_failures == []

    repo = loopback_hub.repos[REPO]
    assert repo.private is True and repo.create_payload["visibility"] == "private"
    assert len(repo.commits) == 1 and repo.commits[0]["summary"].startswith("Upload differentially private")

    expected = {
        "README.md", "mergekit_config.yml", "tokenizer.json", "tokenizer_config.json",
        *(f"{t}/{name}" for t in TASKS for name in ("config.json", "model.safetensors", "dp_privacy.json",
                                                     "tokenizer.json")),
    }
    assert expected <= set(repo.files), sorted(repo.files)
    assert not [p for p in repo.files if p.startswith(".")]
    assert all(is_release_file(p) for p in repo.files), sorted(repo.files)  # the release allow-list
    # the root holds no model: stock loaders cannot pick up the merged encoder with a meaningless head
    assert "config.json" not in repo.files and "model.safetensors" not in repo.files
    assert repo.files["mergekit_config.yml"].decode() == MERGE_YAML

    # the card: metadata, per-task ε/δ/accountant/N, composed guarantee, merge YAML verbatim, evaluation
    card = ModelCard(repo.files["README.md"].decode())
    assert card.data.license == "apache-2.0" and card.data.library_name == "transformers"
    assert {"hf_dpmerge", "differential-privacy", "merge", "mergekit", "peft", "lora"} <= set(card.data.tags)
    assert card.data.pipeline_tag == "text-classification"
    assert {r.dataset_name: r.metric_value for r in card.data.eval_results} == {"alpha": 0.79, "beta": 0.6}
    assert card.data.base_model is None  # runs/base is a local path, not a Hub id
    text = card.text
    assert "mergekit's own card" not in text
    assert "| alpha | 2.5 | not computed | 1e-05 | prv |" in text and "| 1234 | example |" in text
    assert "| beta | 7.75 | not computed | 1e-05 | prv |" in text and "| 5678 | example |" in text
    assert "(ε = 7.75, δ = 1e-05)-DP" in text and "post-processing" in text
    assert f"```yaml\n{MERGE_YAML.rstrip()}\n```" in text
    assert "Method: `task_arithmetic`" in text
    header = "| task | metric | ε | floor | individual | merged | gain retained | retention | interference | examples |"
    assert header in text  # retention never without the floor beside it
    assert "| beta | macro_f1 | 7.75 | 0.4400 | 0.6400 | 0.6000 | 80.0% | 93.8% | +0.0400 | 60 |" in text
    assert "| alpha | accuracy | 2.5 | 0.8500 | 0.8100 | 0.7900 | below floor | 97.5% |" in text
    assert "Not covered by the guarantee" in text

    for task, (num_labels, eps, _n, labels) in TASKS.items():
        adapter = release.runs / task / "adapter"
        # the record travels byte for byte
        assert repo.files[f"{task}/dp_privacy.json"] == (adapter / "dp_privacy.json").read_bytes()
        assert PrivacyRecord.from_dict(json.loads(repo.files[f"{task}/dp_privacy.json"])).epsilon == eps
        # the task model: the merged encoder with exactly the adapter's saved classifier
        weights = load_safetensors_bytes(repo.files[f"{task}/model.safetensors"])
        saved = load_file(str(adapter / "adapter_model.safetensors"))
        merged = load_file(str(release.merged / "model.safetensors"))
        for name in ("classifier.weight", "classifier.bias"):
            assert torch.equal(weights[name], saved[_saved_head_key(saved, name)])
        assert torch.equal(weights["bert.encoder.layer.0.attention.self.query.weight"],
                           merged["bert.encoder.layer.0.attention.self.query.weight"])
        config = json.loads(repo.files[f"{task}/config.json"])
        names = labels or [f"LABEL_{i}" for i in range(num_labels)]
        assert config["num_labels"] == num_labels
        assert config["id2label"] == {str(i): n for i, n in enumerate(names)}

    assert f"to the private repository {REPO}" in out.out and "beta/model.safetensors" in out.out


def _saved_head_key(saved: dict, name: str) -> str:
    """The adapter's key of head tensor ``name`` (peft saves modules_to_save with or without the wrapper)."""
    return next(k for k in saved if k.endswith(name) and "lora_" not in k)


def test_push_public_creates_public_repo(release, cli, loopback_hub):
    assert cli(_push_args(release, "--repo_id", "alice/open", "--public")) == 0
    assert loopback_hub.repos["alice/open"].private is False
    assert "README.md" in loopback_hub.repos["alice/open"].files


def test_push_refuses_existing_public_repo_when_private(release, cli, loopback_hub, capsys):
    loopback_hub.add_repo(REPO, private=False)
    assert cli(_push_args(release, "--repo_id", REPO)) == 2
    assert "already exists and is public" in capsys.readouterr().err
    assert loopback_hub.repos[REPO].commits == []


def test_push_reports_hub_errors(release, cli, loopback_hub, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    assert cli(_push_args(release, "--repo_id", REPO)) == 1
    assert "upload to the Hub failed" in capsys.readouterr().err
    assert REPO not in loopback_hub.repos and loopback_hub.auth_failures


def test_push_refuses_offline_mode(release, cli, loopback_hub, monkeypatch, capsys):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert cli(_push_args(release, "--repo_id", REPO)) == 2
    assert "--dry-run" in capsys.readouterr().err
    assert loopback_hub.requests == []


# ---------------------------------------------------------------------------------------------- dry run


def test_dry_run_stages_without_network(release, cli, loopback_hub, tmp_path, capsys):
    staging = tmp_path / "staged"
    args = ["push", str(release.merged), "--runs", str(release.runs), "--dry-run", "--staging_dir", str(staging),
            "--eval_json", str(release.eval_json), "--base_model", "sentence-transformers/all-MiniLM-L6-v2"]
    assert cli(args) == 0  # tasks discovered from runs/, no --repo_id needed
    out = capsys.readouterr().out
    assert loopback_hub.requests == []
    assert "nothing uploaded" in out and "private repository your-username/merged" in out
    for path in ("README.md", "alpha/model.safetensors", "alpha/config.json", "beta/dp_privacy.json"):
        assert (staging / path).is_file() and path in out
    card = ModelCard.load(staging / "README.md")
    assert card.data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert "| alpha | 2.5 |" in card.text and "| beta | 7.75 |" in card.text
    # the records' one fingerprint names no tensors and runs/ holds no base: nothing was checked, and the card says so
    assert "All adapters record the same base fingerprint" not in card.text
    assert "not checked against the base this model was merged from): `alpha`: `abababababababab…`" in card.text
    assert json.loads((staging / "alpha/config.json").read_text())["id2label"] == {"0": "negative", "1": "positive"}
    # a second dry run replaces its own staging folder
    (staging / "stale.txt").write_text("old")
    assert cli(args) == 0
    assert not (staging / "stale.txt").exists() and (staging / "README.md").is_file()


def test_dry_run_default_staging_dir_and_foreign_dir(release, cli, tmp_path, capsys):
    merged = tmp_path / "merged"
    shutil.copytree(release.merged, merged)
    assert cli(["push", str(merged), "--runs", str(release.runs), "--tasks", "beta", "--dry-run"]) == 0
    staged = tmp_path / "merged-hub"
    assert (staged / "beta/model.safetensors").is_file() and not (staged / "alpha").exists()
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    rc = cli(["push", str(merged), "--runs", str(release.runs), "--dry-run", "--staging_dir", str(foreign)])
    assert rc == 2 and "holds no previous hf-dpmerge push staging" in capsys.readouterr().err
    assert (foreign / "notes.txt").read_text() == "keep me"


# ---------------------------------------------------------------------------------------------- bad input


def _runs_copy(release, tmp_path) -> Path:
    runs = tmp_path / "runs"
    shutil.copytree(release.runs, runs)
    return runs


def _dry(cli, merged, runs, *extra) -> int:
    return cli(["push", str(merged), "--runs", str(runs), "--dry-run", *extra])


def test_missing_merged_dir(release, cli, tmp_path, capsys):
    assert _dry(cli, tmp_path / "nope", release.runs) == 2
    assert "merged model directory" in capsys.readouterr().err


def test_merged_dir_without_model(release, cli, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert _dry(cli, tmp_path / "empty", release.runs) == 2
    assert "no config.json" in capsys.readouterr().err


def test_missing_privacy_record(release, cli, tmp_path, capsys):
    runs = _runs_copy(release, tmp_path)
    (runs / "beta/adapter/dp_privacy.json").unlink()
    assert _dry(cli, release.merged, runs) == 2
    err = capsys.readouterr().err
    assert "no privacy record" in err and "beta" in err
    assert not (release.root / "merged-hub").exists()


def test_corrupt_privacy_record(release, cli, tmp_path, capsys):
    runs = _runs_copy(release, tmp_path)
    (runs / "alpha/adapter/dp_privacy.json").write_text("{not json")
    assert _dry(cli, release.merged, runs) == 2
    assert "corrupt privacy record" in capsys.readouterr().err


def test_record_of_another_task(release, cli, tmp_path, capsys):
    runs = _runs_copy(release, tmp_path)
    shutil.copy(runs / "alpha/adapter/dp_privacy.json", runs / "beta/adapter/dp_privacy.json")
    assert _dry(cli, release.merged, runs) == 2
    assert "record of task 'alpha', not of 'beta'" in capsys.readouterr().err


def test_no_adapters(release, cli, tmp_path, capsys):
    (tmp_path / "runs").mkdir()
    assert _dry(cli, release.merged, tmp_path / "runs") == 2
    assert "no adapters" in capsys.readouterr().err


def test_unknown_task(release, cli, capsys):
    assert _dry(cli, release.merged, release.runs, "--tasks", "alpha,gamma") == 2
    assert "gamma" in capsys.readouterr().err


def test_adapter_without_head(release, cli, tmp_path, capsys):
    runs = _runs_copy(release, tmp_path)
    config_path = runs / "alpha/adapter/adapter_config.json"
    config = json.loads(config_path.read_text())
    config["modules_to_save"] = None
    config_path.write_text(json.dumps(config))
    assert _dry(cli, release.merged, runs) == 2
    assert "saves no classifier head" in capsys.readouterr().err


def test_corrupt_eval_json(release, cli, tmp_path, capsys):
    bad = tmp_path / "eval.json"
    bad.write_text("[1, 2")
    assert _dry(cli, release.merged, release.runs, "--eval_json", str(bad)) == 2
    assert "corrupt evaluation JSON" in capsys.readouterr().err


def test_real_push_needs_repo_id(release, cli, capsys):
    assert cli(["push", str(release.merged), "--runs", str(release.runs)]) == 2
    assert "--repo_id" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- release hygiene


def test_merged_dir_with_files_outside_the_allow_list_is_refused(release, cli, loopback_hub, tmp_path, capsys):
    merged = tmp_path / "merged"
    shutil.copytree(release.merged, merged)
    (merged / "trainer_state.json").write_text("{}")
    (merged / "logs").mkdir()
    (merged / "logs" / "events.out").write_text("loss")
    assert cli(["push", str(merged), "--runs", str(release.runs), "--repo_id", REPO]) == 2
    err = capsys.readouterr().err
    assert "logs/events.out, trainer_state.json" in err and "RELEASE_ALLOW_LIST" in err
    assert REPO not in loopback_hub.repos


def test_training_args_bin_and_hidden_files_in_the_merged_dir_are_refused_by_name(release, cli, loopback_hub,
                                                                                   tmp_path, capsys):
    """Root *.bin / *.safetensors that are not model weights and hidden files are not skipped silently."""
    merged = tmp_path / "merged"
    shutil.copytree(release.merged, merged)
    (merged / "training_args.bin").write_bytes(b"dp_seed=0")
    (merged / "optimizer.safetensors").write_bytes(b"state")
    (merged / ".notes").write_text("private")
    staging = tmp_path / "staged"
    assert _dry(cli, merged, release.runs, "--staging_dir", str(staging)) == 2
    err = capsys.readouterr().err
    assert ".notes, optimizer.safetensors, training_args.bin" in err and "remove these files" in err
    assert not staging.exists()
    assert cli(["push", str(merged), "--runs", str(release.runs), "--repo_id", REPO]) == 2
    assert "training_args.bin" in capsys.readouterr().err and REPO not in loopback_hub.repos

    for name in ("training_args.bin", "optimizer.safetensors", ".notes"):
        (merged / name).unlink()
    assert _dry(cli, merged, release.runs, "--staging_dir", str(staging)) == 0  # removed: the push proceeds


def _seeded_runs(release, tmp_path, seeded) -> Path:
    runs = _runs_copy(release, tmp_path)
    path = runs / "beta/adapter/dp_privacy.json"
    data = json.loads(path.read_text())
    if seeded is None:  # a schema-1 record, written before seeding was recorded
        del data["seeded"], data["eval_data_is_public"]
    else:
        data["seeded"] = seeded
    path.write_text(json.dumps(data))
    return runs


@pytest.mark.parametrize("seeded, reason", [(True, "beta trained with a fixed dp_seed"),
                                            (None, "beta have privacy records written before")])
def test_seeded_release_is_refused_unless_allowed(release, cli, loopback_hub, tmp_path, capsys, seeded, reason):
    runs = _seeded_runs(release, tmp_path, seeded)
    args = ["push", str(release.merged), "--runs", str(runs), "--tasks", "alpha,beta", "--repo_id", REPO]
    assert cli(args) == 2
    err = capsys.readouterr().err
    assert reason in err and "--allow-seeded" in err and "subtract" in err
    assert REPO not in loopback_hub.repos

    assert cli([*args, "--allow-seeded"]) == 0
    card = loopback_hub.repos[REPO].files["README.md"].decode()
    assert "**Seeded training: `beta`.**" in card and "undo it" in card


def _selected_merge(release, tmp_path, seeded, fingerprints=None, beta_epsilon=7.75, total_epsilon=None) -> Path:
    """The release's merged dir with the dp_selection.json of a tune run made with alpha at ε = 2.5 and beta at
    ``beta_epsilon`` (total max + ε_sel = 1 unless ``total_epsilon``): with the adapters' ``fingerprints``, else a
    schema-3 record (``seeded`` None: schema 2)."""
    merged = tmp_path / "merged"
    shutil.copytree(release.merged, merged)
    SelectionRecord(
        mechanism="exponential", epsilon=1.0, sensitivity=1e-3, utility="accuracy",
        relation="addition, removal or replacement", unit="validation example", composition="sequential",
        candidates=[{"lambda": 0.5}, {"lambda": 1.0}], chosen=1, validation_size={"alpha": 500, "beta": 500},
        adapters={"alpha": {"epsilon": 2.5, "delta": 1e-5}, "beta": {"epsilon": beta_epsilon, "delta": 1e-5}},
        total_epsilon=total_epsilon or max(2.5, beta_epsilon) + 1.0, total_delta=1e-5, seeded=seeded,
        fingerprints=fingerprints or {},
    ).save(merged)
    if not fingerprints:
        path = merged / "dp_selection.json"
        data = json.loads(path.read_text())
        del data["fingerprints"]
        if seeded is None:
            del data["seeded"]
        path.write_text(json.dumps({**data, "schema_version": 2 if seeded is None else 3}))
    return merged


@pytest.mark.parametrize("seeded, reason", [(True, "the merge was selected with a fixed --seed"),
                                            (None, "dp_selection.json was written before hf_dpmerge recorded")])
def test_a_seeded_selection_is_refused_unless_allowed(release, cli, loopback_hub, tmp_path, capsys, seeded, reason):
    merged = _selected_merge(release, tmp_path, seeded)
    args = ["push", str(merged), "--runs", str(release.runs), "--tasks", "alpha,beta", "--repo_id", REPO]
    assert cli(args) == 2  # a user error: one line, exit status 2
    err = capsys.readouterr().err
    assert reason in err and "re-run hf-dpmerge tune/evolve without --seed" in err and "--allow-seeded" in err
    assert "Poisson" not in err  # the adapters are unseeded: only the selection is named
    assert REPO not in loopback_hub.repos

    assert cli([*args, "--allow-seeded"]) == 0
    card = loopback_hub.repos[REPO].files["README.md"].decode()
    assert "**Seeded selection.**" in card and "**Seeded training" not in card


def test_an_unseeded_selection_is_released_without_a_seed_warning(release, cli, tmp_path):
    merged = _selected_merge(release, tmp_path, False)
    assert _dry(cli, merged, release.runs, "--tasks", "alpha,beta") == 0
    card = (tmp_path / "merged-hub" / "README.md").read_text()
    assert "among 2 candidates" in card and "Seeded" not in card


def _retrain(runs: Path, task: str, epsilon: float, seed: int) -> None:
    """``task``'s adapter replaced by another training run at ``epsilon``: other weights, its own record."""
    adapter = runs / task / "adapter"
    weights = load_file(adapter / "adapter_model.safetensors")
    generator = torch.Generator().manual_seed(seed)
    save_file({k: v + 0.01 * torch.randn(v.shape, generator=generator) for k, v in weights.items()},
              adapter / "adapter_model.safetensors")
    record = PrivacyRecord.load(adapter)
    record.epsilon = epsilon
    record.save(adapter)


def test_a_tuned_merge_is_released_only_with_the_adapters_it_was_selected_with(release, cli, tmp_path, capsys):
    """tune chose the merge with beta's adapter at ε = 4 (total 5); pushing beta retrained at ε = 8 would
    release an ε = 8 head under "(ε = 5, δ)". The selection's fingerprints refuse it, and a retrain at the same ε
    too (other weights), and a release without one of its tasks; the adapters it was made with pass."""
    runs = _runs_copy(release, tmp_path)
    _retrain(runs, "beta", 4.0, seed=0)
    fingerprints = {task: adapter_fingerprint(runs / task / "adapter") for task in TASKS}  # as tune records them
    merged = _selected_merge(release, tmp_path, False, fingerprints, beta_epsilon=4.0)
    assert _dry(cli, merged, runs, "--tasks", "alpha,beta") == 0
    card = (tmp_path / "merged-hub" / "README.md").read_text()
    assert "**Guarantee: (ε = 5, δ = 1e-05)-DP**" in card and "| beta | 4 |" in card

    assert _dry(cli, merged, runs, "--tasks", "alpha", "--staging_dir", str(tmp_path / "alpha-only")) == 2
    assert "beta: not released" in capsys.readouterr().err
    for epsilon, seed in ((8.0, 1), (4.0, 2)):
        _retrain(runs, "beta", epsilon, seed)
        staging = tmp_path / f"staged-{seed}"
        assert _dry(cli, merged, runs, "--tasks", "alpha,beta", "--staging_dir", str(staging)) == 2
        err = capsys.readouterr().err
        assert ("chose the merge with: beta: fingerprint differs from the adapter selected with. Its ε_sel and total "
                "do not cover this release: re-run hf-dpmerge tune") in err
        assert not staging.exists()


def test_an_older_selection_is_checked_by_each_adapters_epsilon_and_states_at_least_their_total(
        release, cli, tmp_path, capsys):
    """A selection record without fingerprints (schema 3): made with beta at ε = 4 (total 5), it is refused beside
    beta retrained at ε = 7.75; made with the released adapters, the card states the larger of its stored total
    and the one recomputed from their records (ε = 7.75 + 1)."""
    merged = _selected_merge(release, tmp_path, False, beta_epsilon=4.0)
    assert _dry(cli, merged, release.runs, "--tasks", "alpha,beta") == 2
    assert "beta: (ε, δ) differs from the adapter selected with" in capsys.readouterr().err
    shutil.rmtree(merged)
    merged = _selected_merge(release, tmp_path, False, total_epsilon=5.0)  # an understated total
    assert _dry(cli, merged, release.runs, "--tasks", "alpha,beta") == 0
    assert "**Guarantee: (ε = 8.75, δ = 1e-05)-DP**" in (tmp_path / "merged-hub" / "README.md").read_text()
