"""Multi-process DP training (2 processes, gloo on CPU) against the 1-process run on the same Poisson draws."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from opacus.accountants import create_accountant
from transformers import DataCollatorWithPadding

from hf_dpmerge import DPSAMConfig, DPSAMTrainer
from tests.utils.multiprocess_training import (
    NOISE,
    NOISE_DRAWS,
    SINGLE_PROCESS_BATCH,
    cached_run,
    clipped_query,
    free_port,
    noise_only_queries,
    spawn_two_processes,
    training_run,
    unit_level_run,
)
from tests.utils.tiny_models import tiny_tokenizer
from tests.utils.training_helpers import lora_classifier, text_dataset

REPO = Path(__file__).resolve().parents[2]
SAM_MODES = ("none", "per_example")


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    batch = SINGLE_PROCESS_BATCH
    return {
        "dir": out,
        "clipped": {mode: clipped_query(out, mode, batch) for mode in SAM_MODES},
        "noise": noise_only_queries(out, batch),
        "full": training_run(out / "full", batch),
        "unit_level": unit_level_run(out / "units", batch),
        "cached": cached_run(out / "cached", batch),
    }


@pytest.fixture(scope="module")
def two(tmp_path_factory, single):
    out = tmp_path_factory.mktemp("two")
    ranks = spawn_two_processes(out, str(single["dir"] / "full" / "out" / "checkpoint-3"))
    return {"dir": out, "ranks": ranks}


def assert_same_weights(got, want, tol=1e-5):
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_process_shares_partition_the_single_process_draw(single, two):
    for mode in SAM_MODES:
        shares = [rank["clipped"][mode]["rows"] for rank in two["ranks"]]
        assert sorted(shares[0] + shares[1]) == sorted(single["clipped"][mode]["rows"])
        assert not set(shares[0]) & set(shares[1])
        assert abs(len(shares[0]) - len(shares[1])) <= 1 and min(map(len, shares)) > 0


@pytest.mark.parametrize("mode", SAM_MODES)
def test_two_process_clipped_sum_equals_the_single_process_one(single, two, mode):
    ranks = [rank["clipped"][mode] for rank in two["ranks"]]
    reference = single["clipped"][mode]
    assert ranks[0]["expected_batch_size"] == reference["expected_batch_size"] == SINGLE_PROCESS_BATCH
    for a, b in zip(ranks[0]["released"], ranks[1]["released"], strict=True):
        assert torch.equal(a, b)  # every process steps with the same gradient
    for got, want in zip(ranks[0]["released"], reference["released"], strict=True):
        assert torch.linalg.norm(got - want) <= 1e-5 * torch.linalg.norm(want)
    assert any(torch.linalg.norm(g) > 0 for g in reference["released"])
    # the loss is the mean over the whole draw, not over one process's share
    torch.testing.assert_close(ranks[0]["loss"], reference["loss"])
    torch.testing.assert_close(ranks[1]["loss"], reference["loss"])


def test_noise_is_added_once_with_total_variance_sigma_squared_c_squared(single, two):
    draws = [torch.stack(rank["noise"]) for rank in two["ranks"]]
    assert torch.equal(draws[0], draws[1])
    noise = draws[0].double()
    n = noise.numel()
    assert n > NOISE_DRAWS * 1000
    variance = (NOISE["noise_multiplier"] * NOISE["per_sample_max_grad_norm"]) ** 2
    # n·s²/σ²C² ~ χ²_n: relative s.e. of s² is √(2/n) ≈ 0.004; 6 s.e. cannot be reached by chance, while noise
    # added on both processes (2σ²C²) or split without summing (σ²C²/2) is far outside
    assert abs(noise.pow(2).mean().item() / variance - 1) < 6 * math.sqrt(2 / n)
    assert abs(noise.mean().item()) < 6 * math.sqrt(variance / n)
    # the main process draws exactly the noise a seeded 1-process run draws
    torch.testing.assert_close(draws[0], torch.stack(single["noise"]))


def test_processes_agree_on_unseeded_sampling_and_on_calibration_failures(two):
    states = [rank["unseeded_sampler_state"] for rank in two["ranks"]]
    assert torch.equal(states[0], states[1])
    assert not torch.equal(states[0], torch.Generator().manual_seed(0).get_state())
    # an unseeded resume re-seeds the sampling stream from one entropy seed shared by both processes
    resumed = [rank["unseeded_resumed_sampler_state"] for rank in two["ranks"]]
    assert torch.equal(resumed[0], resumed[1])
    errors = [rank["calibration_error"] for rank in two["ranks"]]
    assert errors[0] and errors[0] == errors[1]  # raised on both processes, neither left waiting


def test_a_launch_whose_processes_did_not_join_one_group_is_refused(tmp_path, monkeypatch):
    args = DPSAMConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", accountant="rdp", dp_seed=0,
                       per_device_train_batch_size=20)
    assert args.world_size == 1  # this process's state is set up before WORLD_SIZE claims two processes
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="--use_cpu"):
        DPSAMTrainer(model=lora_classifier(), args=args, train_dataset=text_dataset(),
                     data_collator=DataCollatorWithPadding(tiny_tokenizer()))


def test_epsilon_equals_the_single_process_epsilon_for_the_same_q_sigma_steps(single, two):
    reference = single["full"]
    accountant = create_accountant("rdp")
    accountant.history = [(reference["noise_multiplier"], reference["sample_rate"], reference["steps"])]
    want = accountant.get_epsilon(delta=reference["delta"])
    assert reference["epsilon"] == pytest.approx(want, rel=1e-9)
    for rank in two["ranks"]:
        run = rank["full"]
        assert (run["sample_rate"], run["noise_multiplier"], run["delta"], run["steps"]) == (
            reference["sample_rate"], reference["noise_multiplier"], reference["delta"], reference["steps"])
        assert run["epsilon"] == pytest.approx(want, rel=1e-9)


def test_two_process_training_matches_single_process_training(single, two):
    ranks = [rank["full"] for rank in two["ranks"]]
    for a, b in zip(ranks[0]["params"], ranks[1]["params"], strict=True):
        assert torch.equal(a, b)
    assert_same_weights(ranks[0]["params"], single["full"]["params"])
    assert len(ranks[0]["losses"]) == len(single["full"]["losses"]) == 6
    assert ranks[0]["losses"] == pytest.approx(single["full"]["losses"], rel=1e-4)
    # prediction gathers every process's share of the evaluation set, in order
    torch.testing.assert_close(ranks[0]["predictions"], single["full"]["predictions"], rtol=1e-4, atol=1e-5)


def test_only_the_main_process_writes_privacy_records_and_dp_state(two):
    main, other = (rank["full"]["saved_records"] for rank in two["ranks"])
    assert other == []
    full = two["dir"] / "full"
    assert main[:2] == [str(full / "out" / "checkpoint-3"), str(full / "out" / "checkpoint-6")]
    # the release is written in a staging folder beside the adapter and renamed into place
    assert len(main) == 3 and Path(main[2]).name == "adapter" and Path(main[2]).is_relative_to(full)
    assert (full / "adapter" / "dp_privacy.json").exists()
    assert all((full / "out" / f"checkpoint-{s}" / "dp_state.pt").exists() for s in (3, 6))


def test_checkpoints_resume_across_one_and_two_processes(tmp_path, single, two):
    full_two = two["ranks"][0]["full"]
    # two processes, resumed from a two-process checkpoint
    for rank in two["ranks"]:
        assert rank["resumed"]["epsilon"] == pytest.approx(full_two["epsilon"], rel=1e-12)
        assert rank["resumed"]["steps"] == 6
        assert_same_weights(rank["resumed"]["params"], full_two["params"])
    # two processes, resumed from a one-process checkpoint
    resumed_from_single = two["ranks"][0]["resumed_from_single"]
    assert resumed_from_single["epsilon"] == pytest.approx(single["full"]["epsilon"], rel=1e-12)
    assert_same_weights(resumed_from_single["params"], single["full"]["params"])
    # one process, resumed from a two-process checkpoint
    resumed = training_run(tmp_path, SINGLE_PROCESS_BATCH, str(two["dir"] / "full" / "out" / "checkpoint-3"))
    assert resumed["epsilon"] == pytest.approx(full_two["epsilon"], rel=1e-12)
    assert_same_weights(resumed["params"], full_two["params"])


def launch_two_cpu_processes(out: Path) -> subprocess.CompletedProcess:
    """``accelerate launch`` of the module's two-process training run, writing into ``out``."""
    # `--cpu --num_processes 2` starts one process unless MPI is configured (accelerate's multi-CPU path is
    # mpirun); `--multi_gpu` is accelerate's torch launcher, and the script's trainers ask for use_cpu (gloo)
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(free_port()), "--module", "tests.utils.multiprocess_training", str(out)]
    return subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, timeout=600)


def aborted_in_gloo_teardown(done: subprocess.CompletedProcess, out: Path) -> bool:
    """A launch whose processes all wrote their results and the release, then one aborted on its way out."""
    written = all((out / f"rank{r}.pt").exists() for r in range(2)) and (out / "adapter" / "dp_privacy.json").exists()
    return done.returncode != 0 and written and "terminate called without an active exception" in done.stderr


@pytest.mark.slow
def test_accelerate_launch_of_two_cpu_processes_trains_like_one_process(tmp_path, single):
    out = tmp_path / "launch"
    done = launch_two_cpu_processes(out)
    if aborted_in_gloo_teardown(done, out):
        # torch 2.13's gloo teardown rarely aborts a process after everything was written (about 1 launch in 100
        # under heavy CPU load, none idle: docs/privacy.md); judge a second launch, which must end cleanly
        out = tmp_path / "relaunch"
        done = launch_two_cpu_processes(out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert ranks[1]["saved_records"] == [] and Path(ranks[0]["saved_records"][-1]).name == "adapter"
    assert (out / "adapter" / "dp_privacy.json").exists()
    for rank in ranks:
        assert rank["epsilon"] == pytest.approx(single["full"]["epsilon"], rel=1e-9)
        assert_same_weights(rank["params"], single["full"]["params"])


def test_unit_level_draws_are_shared_by_unit_and_train_like_one_process(single, two):
    reference = single["unit_level"]
    shares = [rank["unit_level"]["rows"] for rank in two["ranks"]]
    assert sorted(shares[0] + shares[1]) == sorted(reference["rows"]) and reference["rows"]
    units = [{row % 40 for row in share} for share in shares]
    assert not units[0] & units[1]  # each unit's rows, and so its clipped sum, lie on one process
    for rank in two["ranks"]:
        run = rank["unit_level"]
        assert run["sample_rate"] == reference["sample_rate"] == 4 / 40
        assert run["epsilon"] == pytest.approx(reference["epsilon"], rel=1e-12)
        assert_same_weights(run["params"], reference["params"])


def test_two_processes_on_the_cached_prefix_end_at_the_single_process_weights(single, two):
    """Each process caches the whole training set and trains its share of every draw on the top layer."""
    for rank in two["ranks"]:
        assert rank["cached"]["epsilon"] == pytest.approx(single["cached"]["epsilon"], rel=1e-12)
        assert_same_weights(rank["cached"]["params"], single["cached"]["params"])
