"""FFA-LoRA: every A drawn from a public seed and frozen; only B and the head are trained and noised."""

import subprocess
import sys

import torch

from hf_dpmerge.lora import lora_factors
from hf_dpmerge.training.alignment import alignment_penalty
from hf_dpmerge.training.shared_lora_a import freeze_shared_lora_a, lora_a_tensors
from tests.utils.training_helpers import lora_classifier, make_trainer

SEED = 7


def ffa_classifier(seed: int = SEED, num_labels: int = 2, model_seed: int = 0):
    model = lora_classifier(seed=model_seed, num_labels=num_labels)
    freeze_shared_lora_a(model, seed)
    return model


def test_a_is_unchanged_by_training_and_is_the_seeds_draw_in_another_process(tmp_path):
    trainer = make_trainer(tmp_path, model=ffa_classifier(), max_steps=3, noise_multiplier=5.0, target_epsilon=None)
    before = {name: a.detach().clone() for name, a in lora_a_tensors(trainer.model).items()}
    trainer.train()
    after = lora_a_tensors(trainer.model)
    assert before and all(torch.equal(after[name], a) for name, a in before.items())  # bitwise
    assert any(f.lora_b.abs().sum() > 0 for f in lora_factors(trainer.model))  # while B trained
    code = ("from hf_dpmerge.training.shared_lora_a import freeze_shared_lora_a;"
            "from tests.utils.training_helpers import lora_classifier;"
            f"print(freeze_shared_lora_a(lora_classifier(seed=3), {SEED}))")  # another process, other init
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()[-1]
    record = trainer.privacy_record().extra["lora_a"]
    assert record == {"seed": SEED, "fingerprint": fresh}


def test_noise_is_added_to_b_and_the_head_only(tmp_path):
    model = ffa_classifier()
    trainer = make_trainer(tmp_path, model=model)
    noised = {id(p) for p in trainer.privatizer.params}
    b_and_head = [p for n, p in model.named_parameters() if ".lora_B." in n or ".modules_to_save." in n]
    a = list(lora_a_tensors(model).values())
    assert noised == {id(p) for p in b_and_head} and not noised & {id(p) for p in a}
    count = sum(p.numel() for p in trainer.privatizer.params)
    assert count == sum(p.numel() for p in b_and_head) == sum(p.numel() for p in lora_classifier().parameters()
                                                               if p.requires_grad) - sum(p.numel() for p in a)
    assert sum(g.numel() for g in trainer.privatizer.release()) == count


def test_two_tasks_share_a_and_another_seed_does_not(tmp_path):
    """Two tasks (different label spaces, head initialisations and data) record the same A fingerprint."""
    records = [make_trainer(tmp_path / str(labels), model=ffa_classifier(num_labels=labels, model_seed=labels),
                            max_steps=1) for labels in (2, 3)]
    for trainer in records:
        trainer.train()
    first, second = (trainer.privacy_record().extra["lora_a"]["fingerprint"] for trainer in records)
    other = freeze_shared_lora_a(lora_classifier(), SEED + 1)
    assert first == second != other


def test_alignment_gradient_acts_on_b_only():
    """∂/∂B λ‖s·B·A‖² = 2λs²·B·A·Aᵀ with A frozen; A gets no gradient."""
    model = ffa_classifier()
    factors = list(lora_factors(model))
    with torch.no_grad():
        for f in factors:
            f.lora_b.normal_()
    bs = [f.lora_b for f in factors]
    grads = torch.autograd.grad(alignment_penalty(model, 0.3), bs)
    for f, g in zip(factors, grads):
        torch.testing.assert_close(g, 2 * 0.3 * f.scaling**2 * f.lora_b @ f.lora_a @ f.lora_a.T)
        assert not f.lora_a.requires_grad
