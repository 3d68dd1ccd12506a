"""DPSAMTrainer on a causal LM trained on instructions: the loss is the response's, clipping is per whole
example (prompt + response), and the script's release carries the accountant's ε."""

import pytest
import torch
from datasets import Dataset
from opacus.accountants.utils import create_accountant
from transformers import AutoTokenizer, DataCollatorForSeq2Seq

from hf_dpmerge import PrivacyRecord
from hf_dpmerge.data.instructions import IGNORE_INDEX, instruction_format, response_ids, tokenize_instructions
from hf_dpmerge.data.tasks import get_task_spec
from hf_dpmerge.training.lora_causal_lm import lora_causal_lm
from tests.utils.tiny_models import CORPUS, save_tiny_llama
from tests.utils.training_helpers import make_trainer

SPEC = get_task_spec("rotten_tomatoes")


@pytest.fixture
def tiny_base(tmp_path):
    return save_tiny_llama(tmp_path / "base")


def reviews(copies: int = 5) -> Dataset:
    texts = CORPUS * copies
    return Dataset.from_dict({"text": texts, "label": [i % 2 for i in range(len(texts))]})


def causal_trainer(tmp_path, base, train_answer_end: bool = True, **overrides):
    """A trainer of LoRA on the tiny Llama over instruction rows; noise-free (σ silenced) unless told otherwise."""
    tokenizer = AutoTokenizer.from_pretrained(base)
    rows = tokenize_instructions(reviews(), SPEC, tokenizer, max_length=40, train_answer_end=train_answer_end)
    model = lora_causal_lm(base, r=4, alpha=8, target_modules=["q_proj", "v_proj"])
    settings = {"sam_mode": "none", "noise_multiplier": 0.0, "physical_batch_size": 3, **overrides}
    trainer = make_trainer(tmp_path, model=model, dataset=rows, **settings)
    trainer.data_collator = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX)
    return trainer, rows


def response_only_loss(model, row, response_length: int = 2, trained: int = 2) -> torch.Tensor:
    """−mean log p(the first ``trained`` response tokens | everything before), from the row's ids and the
    response's length alone (the tiny tokenizer's verbalisers are one token, then the end of sequence)."""
    ids = torch.tensor([row["input_ids"]])
    prompt = len(row["input_ids"]) - response_length
    logits = model(input_ids=ids).logits[0]
    log_probs = torch.log_softmax(logits[prompt - 1:prompt - 1 + trained], dim=-1)
    return -log_probs.gather(1, ids[0, prompt:prompt + trained, None]).mean()


def test_rows_are_prompt_then_response_with_the_prompt_masked(tiny_base):
    tokenizer = AutoTokenizer.from_pretrained(tiny_base)
    long = Dataset.from_dict({"text": [" ".join(CORPUS * 3), CORPUS[0]], "label": [1, 0]})
    rows = tokenize_instructions(long, SPEC, tokenizer, max_length=30)
    for row, label in zip(rows, (1, 0)):
        response = response_ids(tokenizer, instruction_format(SPEC).verbalisers[label])
        assert response[-1] == tokenizer.eos_token_id and len(response) == 2
        prompt = len(row["input_ids"]) - len(response)
        assert row["labels"] == [IGNORE_INDEX] * prompt + response
        assert row["input_ids"][prompt:] == response
        assert len(row["input_ids"]) <= 30
    assert len(rows[0]["input_ids"]) == 30  # the long review was cut to fit, the answer kept


def test_an_untrained_answer_end_stays_in_the_input_out_of_the_loss(tiny_base):
    tokenizer = AutoTokenizer.from_pretrained(tiny_base)
    trained = tokenize_instructions(reviews(1), SPEC, tokenizer, max_length=40)
    untrained = tokenize_instructions(reviews(1), SPEC, tokenizer, max_length=40, train_answer_end=False)
    for row, plain in zip(untrained, trained):
        assert row["input_ids"] == plain["input_ids"] and row["input_ids"][-1] == tokenizer.eos_token_id
        assert row["labels"] == plain["labels"][:-1] + [IGNORE_INDEX]
        assert row["labels"][-2] == plain["labels"][-2] != IGNORE_INDEX  # the verbaliser is still trained


def test_without_the_answer_end_the_gradient_is_the_verbalisers_loss(tmp_path, tiny_base):
    trainer, rows = causal_trainer(tmp_path, tiny_base, train_answer_end=False, per_sample_max_grad_norm=1e6)
    model = trainer.model
    model.train()
    chosen = [0, 1, 2, 3]
    released, _ = trainer._query(model, trainer._prepare_inputs(trainer.data_collator([rows[i] for i in chosen])))
    verbaliser = torch.autograd.grad(sum(response_only_loss(model, rows[i], trained=1) for i in chosen),
                                     trainer._params)
    for got, expected in zip(released, verbaliser):
        torch.testing.assert_close(got, expected / trainer.expected_batch_size, rtol=1e-4, atol=1e-9)


def test_gradient_is_the_response_loss_only(tmp_path, tiny_base):
    """The trainer's (noise-free, unclipped) gradient equals that of the response tokens' loss, and differs from
    the loss over prompt tokens too: labelling the prompt would change it."""
    trainer, rows = causal_trainer(tmp_path, tiny_base, per_sample_max_grad_norm=1e6)
    model = trainer.model
    model.train()
    chosen = [0, 1, 2, 3, 4]
    inputs = trainer._prepare_inputs(trainer.data_collator([rows[i] for i in chosen]))
    released, _ = trainer._query(model, inputs)
    unmasked = dict(inputs, labels=inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, IGNORE_INDEX))
    with_prompt, _ = trainer._query(model, unmasked)
    assert max((a - b).abs().max().item() for a, b in zip(with_prompt, released)) > 1e-3

    want = torch.autograd.grad(sum(response_only_loss(model, rows[i]) for i in chosen), trainer._params)
    for got, expected in zip(released, want):
        torch.testing.assert_close(got, expected / trainer.expected_batch_size, rtol=1e-4, atol=1e-9)


def test_each_example_is_clipped_to_c_over_prompt_and_response(tmp_path, tiny_base):
    """Per-sample clipping of the whole sequence's gradient: the clipped sum equals one example at a time,
    each gradient (all LoRA factors jointly) scaled to norm ≤ C; clipping is active for every example."""
    clip = 1e-3
    trainer, rows = causal_trainer(tmp_path, tiny_base, per_sample_max_grad_norm=clip)
    model = trainer.model
    model.train()
    chosen = [0, 3, 5, 6, 9]  # different lengths: padding inside micro-batches of 3
    inputs = trainer._prepare_inputs(trainer.data_collator([rows[i] for i in chosen]))
    released, _ = trainer._query(model, inputs)
    total = [torch.zeros_like(p) for p in trainer._params]
    for i in chosen:
        grads = torch.autograd.grad(response_only_loss(model, rows[i]), trainer._params)
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads)).item()
        assert norm > clip
        for t, g in zip(total, grads):
            t.add_(g * min(1.0, clip / (norm + 1e-6)))
    for got, want in zip(released, total):
        torch.testing.assert_close(got, want / trainer.expected_batch_size, rtol=1e-4, atol=1e-10)
    released_norm = torch.sqrt(sum(g.pow(2).sum() for g in released)).item() * trainer.expected_batch_size
    assert released_norm <= len(chosen) * clip * (1 + 1e-5)


def test_the_release_records_the_accountants_epsilon(tmp_path, tiny_base):
    trainer, _ = causal_trainer(tmp_path, tiny_base, noise_multiplier=None, target_epsilon=4.0, sam_mode="dp_sat",
                                align_lambda=0.05, max_steps=2, per_device_train_batch_size=8)
    trainer.train()
    trainer.save_model(str(tmp_path / "adapter"))
    record = PrivacyRecord.load(tmp_path / "adapter")
    accountant = create_accountant("rdp")
    for _ in range(2):
        accountant.step(noise_multiplier=trainer.noise_multiplier, sample_rate=8 / len(trainer.train_dataset))
    assert record.steps == 2 and record.dp and record.privacy_unit == "example"
    assert record.epsilon == pytest.approx(accountant.get_epsilon(delta=record.delta), rel=1e-9)
    assert record.epsilon <= 4.0


def test_ffa_lora_freezes_the_seeded_a_and_the_release_records_it(tmp_path, tiny_base):
    """``--lora_freeze_a`` on a causal LM: every A is its public seeded draw and stays put, only B trains, and the
    record names the seed (as for classifiers)."""
    from hf_dpmerge.training.shared_lora_a import lora_a_fingerprint, lora_a_tensors, seeded_lora_a

    model = lora_causal_lm(tiny_base, r=4, alpha=8, target_modules=["q_proj", "v_proj"], freeze_a=True, a_seed=7)
    drawn = {name: a.detach().clone() for name, a in lora_a_tensors(model).items()}
    for name, a in drawn.items():
        rank, fan_in = a.shape
        torch.testing.assert_close(a, seeded_lora_a(7, name.split(".lora_A.")[0], rank, fan_in), rtol=0, atol=0)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        n for n, _ in model.named_parameters() if ".lora_B." in n}
    tokenizer = AutoTokenizer.from_pretrained(tiny_base)
    trainer = make_trainer(tmp_path, model=model, dataset=tokenize_instructions(reviews(), SPEC, tokenizer, 40),
                           sam_mode="none", noise_multiplier=None, target_epsilon=4.0, physical_batch_size=3,
                           max_steps=2, per_device_train_batch_size=8, learning_rate=0.1)
    trainer.data_collator = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX)
    trainer.train()
    for name, a in lora_a_tensors(trainer.model).items():
        torch.testing.assert_close(a, drawn[name], rtol=0, atol=0)
    trainer.save_model(str(tmp_path / "adapter"))
    assert PrivacyRecord.load(tmp_path / "adapter").extra["lora_a"] == {"seed": 7,
                                                                       "fingerprint": lora_a_fingerprint(model)}
