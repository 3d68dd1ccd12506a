"""Empirical privacy audit: the one-run ε lower bound, canaries, guesses, and audits of tiny training runs."""

import json
import math

import numpy as np
import pytest
from datasets import Dataset

from hf_dpmerge import DPSAMConfig, PrivacyRecord
from hf_dpmerge.audit.audit import audit_training
from hf_dpmerge.audit.canaries import canary_vocabulary, make_canaries
from hf_dpmerge.audit.membership import one_run_guesses
from hf_dpmerge.audit.one_run_bound import audit_p_value, epsilon_lower_bound
from hf_dpmerge.cli.main import main
from hf_dpmerge.data.tasks import TaskSpec
from hf_dpmerge.training.dp.privatizer import GradientPrivatizer
from tests.utils.tiny_models import CORPUS, save_tiny_bert, tiny_tokenizer
from tests.utils.training_helpers import lora_classifier

BETA = 0.05


def written_out_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """T(v) + 2mδ·max_i [T(v−i) − T(v)]/i with T from exact binomial coefficients, term by term."""
    q = math.exp(eps) / (1 + math.exp(eps))
    pmf = [math.comb(r, k) * q**k * (1 - q) ** (r - k) for k in range(r + 1)]

    def tail(k: int) -> float:
        return math.fsum(pmf[max(k, 0):])

    slack = max(((tail(v - i) - tail(v)) / i for i in range(1, v + 1)), default=0.0)
    return min(tail(v) + 2 * m * delta * slack, 1.0)


def bound(m: int, r: int, v: int, delta: float, confidence: float = 1 - BETA) -> float:
    return epsilon_lower_bound(num_canaries=m, num_guesses=r, num_correct=v, delta=delta, confidence=confidence)


@pytest.mark.parametrize("m, r, v, delta", [(50, 20, 17, 1e-3), (200, 40, 40, 1e-5), (30, 30, 12, 0.0),
                                            (100, 10, 0, 1e-4), (40, 20, 19, 0.04)])
@pytest.mark.parametrize("eps", [0.0, 0.7, 3.0])
def test_p_value_matches_the_bound_written_out(m, r, v, delta, eps):
    got = audit_p_value(num_canaries=m, num_guesses=r, num_correct=v, epsilon=eps, delta=delta)
    assert got == pytest.approx(written_out_p_value(m, r, v, eps, delta), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("m, r, v, delta", [(1000, 100, 75, 1e-4), (100, 40, 36, 1e-5), (60, 20, 19, 0.0),
                                            (60, 40, 39, 0.01)])  # the last has 2mδ > 1: p need not be monotone
def test_lower_bound_is_the_largest_rejected_epsilon(m, r, v, delta):
    eps = bound(m, r, v, delta)
    assert eps > 0
    assert written_out_p_value(m, r, v, eps, delta) <= BETA + 1e-12
    assert all(written_out_p_value(m, r, v, e, delta) > BETA for e in np.linspace(eps + 1e-6, eps + 6, 150))


def test_lower_bound_reproduces_the_papers_worked_examples():
    # arXiv:2305.08846v1: App. D (m=1000, r=100, v=75, δ=1e-4 → 0.673) and §7 (1439 of 1510 → 2.675, truncated)
    assert bound(1000, 100, 75, 1e-4) == pytest.approx(0.673, abs=1e-3)
    assert bound(100_000, 1510, 1439, 1e-5) == pytest.approx(2.6755, abs=1e-3)


def test_all_correct_pure_dp_has_a_closed_form():
    # δ = 0 and v = r: p(ε) = q^r ≤ β  ⇔  ε ≤ −ln(β^(−1/r) − 1)
    for r in (5, 20, 100):
        assert bound(r, r, r, 0.0) == pytest.approx(-math.log(BETA ** (-1 / r) - 1), rel=1e-6)


def test_lower_bound_grows_with_correct_guesses_and_is_zero_at_chance():
    bounds = [bound(400, 100, v, 1e-5) for v in range(0, 101, 5)]
    assert all(a <= b for a, b in zip(bounds, bounds[1:]))
    assert bounds[:12] == [0.0] * 12  # up to 55 of 100: P[Binomial(100, ½) ≥ 55] ≈ 0.18 > β
    assert bounds[-1] > 3
    assert bound(400, 100, 90, 1e-5, confidence=0.99) < bound(400, 100, 90, 1e-5)
    assert bound(400, 100, 90, 1e-3) < bound(400, 100, 90, 1e-5) < bound(400, 100, 90, 0.0)


def test_randomized_response_at_epsilon_is_flagged_at_most_beta_of_the_time():
    """An exactly ε-DP guesser (each guess right with probability e^ε/(1+e^ε)) may be refuted ≤ β of the time."""
    eps, r = 1.0, 100
    correct = np.random.default_rng(0).binomial(r, 1 / (1 + math.exp(-eps)), size=4000)
    refuted = {v: bound(r, r, int(v), 0.0) > eps for v in np.unique(correct)}
    rate = np.mean([refuted[v] for v in correct])
    assert 0 < rate <= BETA + 0.01


def test_bad_counts_and_confidence_are_refused():
    with pytest.raises(ValueError, match="correct guesses"):
        bound(10, 20, 5, 0.0)
    with pytest.raises(ValueError, match="correct guesses"):
        bound(50, 20, 21, 0.0)
    with pytest.raises(ValueError, match="confidence"):
        bound(50, 20, 10, 0.0, confidence=1.0)
    with pytest.raises(ValueError, match="delta"):
        bound(50, 20, 10, 1.0)


TOY10 = TaskSpec("toy10", 10, tuple(f"class{i}" for i in range(10)), ("text",), "accuracy", "packaged")


def test_canaries_are_distinct_words_with_random_labels_and_fair_coins():
    tok = tiny_tokenizer()
    vocabulary = canary_vocabulary(tok)
    assert not {"[PAD]", "[UNK]", "[CLS]"} & set(vocabulary)
    canaries = make_canaries(tok, TOY10, count=50, length=1, seed=3)
    words = canaries.examples["text"]
    assert len(set(words)) == 50 and set(words) <= set(vocabulary)
    assert canaries.examples[:] == make_canaries(tok, TOY10, count=50, length=1, seed=3).examples[:]
    assert words != make_canaries(tok, TOY10, count=50, length=1, seed=4).examples["text"]
    many = make_canaries(tok, TOY10, count=4000, length=3, seed=0)  # more words than the vocabulary: reused
    assert set(many.examples["label"]) == set(range(10))
    assert abs(many.included.mean() - 0.5) < 0.03
    assert len(many.included_examples()) == many.included.sum()
    with pytest.raises(ValueError, match="regression"):
        make_canaries(tok, TaskSpec("r", 1, (), ("text",), "pearson", "packaged"), count=5, length=1, seed=0)


def test_guesses_take_the_extremes_and_abstain_in_between():
    guesses = one_run_guesses(np.array([0.3, -2.0, 5.0, 0.1, 1.0]), k_plus=2, k_minus=1)
    assert guesses.tolist() == [0, -1, 1, 0, 1]
    with pytest.raises(ValueError, match="k₊"):
        one_run_guesses(np.zeros(5), k_plus=3, k_minus=3)


def audit(tmp_path, seed: int, **overrides):
    """One audit on the tiny BERT: 50 one-word canaries on a 10-class head (a canary not trained on gets its
    random label right by chance only 1 time in 10), k₊ = k₋ = 10 fixed in advance."""
    settings = dict(
        output_dir=str(tmp_path / f"audit{seed}"), per_device_train_batch_size=32, physical_batch_size=32,
        max_steps=60, learning_rate=0.1, lr_scheduler_type="constant", weight_decay=0.0, sam_mode="none",
        align_lambda=0.0, target_delta=1e-5, accountant="rdp", seed=seed, dp_seed=seed, use_cpu=True,
        report_to="none", save_strategy="no", disable_tqdm=True,
    )
    settings.update(overrides)
    train = Dataset.from_dict({"text": CORPUS * 5, "label": [i % 2 for i in range(len(CORPUS) * 5)]})
    return audit_training(
        lora_classifier(seed=seed, num_labels=10), tiny_tokenizer(), train, TOY10, DPSAMConfig(**settings),
        num_canaries=50, k_plus=10, k_minus=10, canary_length=1, seed=seed,
    )


def test_without_noise_the_audit_finds_clear_leakage(tmp_path):
    result = audit(tmp_path, seed=0, dp=False)
    assert result.claimed_epsilon == math.inf and result.delta == 1e-5
    assert result.num_correct >= 19 and result.epsilon_lower >= 1.0
    saved = json.loads(result.save(tmp_path / "audit.json").read_text())
    assert saved["epsilon_lower"] == result.epsilon_lower and saved["num_guesses"] == 20
    assert saved["claimed_epsilon"] == math.inf and len(saved["scores"]) == len(saved["included"]) == 50
    record = PrivacyRecord.load(result.adapter_dir)
    assert record.num_samples == 40 + result.num_included and not record.dp


def test_a_trainer_that_drops_the_noise_is_refuted(tmp_path, monkeypatch):
    """Clipping kept, noise silently skipped, ε still accounted: the audit must catch the false claim."""
    import hf_dpmerge.training.dpsam_trainer as dpsam_trainer

    class NoiselessPrivatizer(GradientPrivatizer):
        def __init__(self, params, **settings):
            super().__init__(params, **{**settings, "noise_multiplier": 0.0})

    monkeypatch.setattr(dpsam_trainer, "GradientPrivatizer", NoiselessPrivatizer)
    result = audit(tmp_path, seed=0, dp=True, target_epsilon=1.0)
    assert 0.9 < result.claimed_epsilon <= 1.0
    assert result.epsilon_lower > result.claimed_epsilon


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_at_the_claimed_epsilon_the_lower_bound_never_exceeds_it(tmp_path, seed):
    # without noise the same runs give 1.29–1.82 (19–20 of 20 guesses), so a broken noise path fails this
    result = audit(tmp_path, seed=seed, dp=True, target_epsilon=1.0)
    assert 0.9 < result.claimed_epsilon <= 1.0 and result.delta == result.claimed_delta == 1e-5
    assert result.epsilon_lower <= result.claimed_epsilon


@pytest.mark.slow
def test_cli_audits_a_packaged_task_and_prints_bound_and_claim(tmp_path, capsys):
    base = save_tiny_bert(tmp_path / "base")
    out = tmp_path / "report" / "audit.json"
    code = main([
        "audit", "--task", "bbc_news", "--model_name_or_path", str(base), "--max_train_samples", "40",
        "--num_canaries", "20", "--canary_length", "2", "--max_length", "16", "--output", str(out),
        "--max_steps", "3", "--per_device_train_batch_size", "16", "--physical_batch_size", "16",
        "--target_epsilon", "4", "--accountant", "rdp", "--sam_mode", "two_query", "--align_lambda", "0.1",
        "--use_cpu", "--dp_seed", "0",
    ])
    assert code == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert f"empirical ε lower bound: {data['epsilon_lower']:.3f}" in printed
    assert f"claimed ε: {data['claimed_epsilon']:.3g}" in printed and "does not prove" in printed
    assert data["num_canaries"] == 20 and data["k_plus"] == data["k_minus"] == 2
    assert data["privacy_record"]["sam_mode"] == "two_query" and data["privacy_record"]["align_lambda"] == 0.1
    assert data["claimed_epsilon"] <= 4 and data["epsilon_lower"] <= data["claimed_epsilon"]
    adapter_config = json.loads((tmp_path / "report" / "audit_adapter" / "adapter_config.json").read_text())
    assert adapter_config["layers_to_transform"] == [1]  # train_glue.py's default: the top half of 2 layers


def test_cli_refuses_bad_audit_settings_before_training(capsys):
    assert main(["audit", "--num_canaries", "0"]) == 2
    assert "--num_canaries must be positive" in capsys.readouterr().err
