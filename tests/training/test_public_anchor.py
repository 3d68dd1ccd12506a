"""The public anchor of a causal-LM adapter: its rows are the base's own greedy answers to public prompts, it is
zero with a zero gradient at the base, its gradient is a naive full-model KL's (cached prefix or not), it enters a
step after the noise and never a clipped sum, and a release says it was used."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq

from hf_dpmerge import PrivacyRecord
from hf_dpmerge.data.instructions import IGNORE_INDEX, render_prompt, tokenize_instructions
from hf_dpmerge.data.public_prompts import PACKAGED, load_public_prompts, prompts_digest
from hf_dpmerge.data.tasks import get_task_spec
from hf_dpmerge.lora import lora_factors
from hf_dpmerge.training.cached_prefix import CachedPrefixTrainer
from hf_dpmerge.training.dpsam_trainer import DPSAMTrainer
from hf_dpmerge.training.lora_causal_lm import lora_causal_lm
from hf_dpmerge.training.public_anchor import anchor_rows
from tests.training.test_causal_lm_training import reviews
from tests.utils.tiny_models import save_tiny_llama
from tests.utils.training_helpers import lora_classifier, make_trainer, text_dataset, trainer_config

PROMPTS = ["What colour is the sky?", "Is water wet? Answer yes or no.", "Name a fruit.", "How many legs has a cat?",
           "Spell cat backwards."]


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("anchor") / "base")


def top_layer_lm(base):
    torch.manual_seed(0)  # the same LoRA A draw in every model of a test
    return lora_causal_lm(base, r=4, alpha=8, target_modules=["q_proj", "v_proj"], layers="1")


def drifted(model, seed: int = 1):
    """``model`` with every LoRA B drawn at random: an adapter away from the base."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for factor in lora_factors(model):
            factor.lora_b.copy_(0.5 * torch.randn(factor.lora_b.shape, generator=generator))
    return model


def trainer_pair_inputs(base, tmp_path, cls=DPSAMTrainer, anchor_lambda=0.7, **overrides):
    tokenizer = AutoTokenizer.from_pretrained(base)
    rows = tokenize_instructions(reviews(), get_task_spec("rotten_tomatoes"), tokenizer, max_length=40)
    model = top_layer_lm(base)
    anchor = anchor_rows(model, tokenizer, PROMPTS, max_new_tokens=6)
    extra = {"cache_dtype": "float32"} if cls is CachedPrefixTrainer else {}
    settings = {"sam_mode": "none", "per_device_train_batch_size": 8, "physical_batch_size": 2, **overrides}
    trainer = cls(model=model, args=trainer_config(tmp_path, anchor_lambda=anchor_lambda, **settings),
                  train_dataset=rows, anchor_rows=anchor,
                  data_collator=DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX), **extra)
    return trainer, anchor


def naive_anchor(model, base_model, anchor, anchor_lambda: float) -> torch.Tensor:
    """μ · mean over rows of the mean over answer positions of KL(p_base ‖ p_θ), one unpadded full-model pass per
    row, every position's logits."""
    total = 0.0
    for row in anchor:
        ids = torch.tensor([row["input_ids"]])
        answer = torch.tensor(row["labels"][1:]) != IGNORE_INDEX
        log_p = torch.log_softmax(model(input_ids=ids).logits[0, :-1], dim=-1)[answer]
        with torch.no_grad():
            log_base = torch.log_softmax(base_model(input_ids=ids).logits[0, :-1], dim=-1)[answer]
        total = total + (log_base.exp() * (log_base - log_p)).sum(dim=-1).mean()
    return anchor_lambda * total / len(anchor)


def test_rows_are_the_prompt_then_the_bases_own_greedy_answer(tiny_base):
    tokenizer = AutoTokenizer.from_pretrained(tiny_base)
    base = AutoModelForCausalLM.from_pretrained(tiny_base).eval()
    rows = anchor_rows(drifted(top_layer_lm(tiny_base)), tokenizer, PROMPTS, max_new_tokens=6)
    assert len(rows) == len(PROMPTS)
    for prompt, row in zip(PROMPTS, rows):
        ids = tokenizer(render_prompt(tokenizer, prompt), add_special_tokens=False)["input_ids"]
        answer = row["input_ids"][len(ids):]
        assert row["input_ids"][:len(ids)] == ids and row["labels"] == [IGNORE_INDEX] * len(ids) + answer
        want = list(ids)  # the base's greedy continuation (the drifted adapter is disabled), one token at a time
        for _ in range(6):
            with torch.no_grad():
                token = int(base(input_ids=torch.tensor([want])).logits[0, -1].argmax())
            want.append(token)
            if token == tokenizer.eos_token_id:
                break
        assert answer == want[len(ids):] and 1 <= len(answer) <= 6


def test_at_the_base_the_anchor_and_its_gradient_are_zero(tmp_path, tiny_base):
    trainer, _ = trainer_pair_inputs(tiny_base, tmp_path)
    grads = trainer._anchor_gradient(trainer.model)
    assert all(g is not None for g in grads)  # every LoRA factor is read, and its gradient is zero
    for g in grads:
        assert torch.count_nonzero(g.abs() > 1e-7) == 0


@pytest.mark.parametrize("cls", [DPSAMTrainer, CachedPrefixTrainer])
def test_the_anchor_gradient_is_a_naive_full_model_kls(tmp_path, tiny_base, cls):
    trainer, anchor = trainer_pair_inputs(tiny_base, tmp_path, cls)
    if cls is CachedPrefixTrainer:
        assert trainer.boundary == 1  # the anchor rows run the top layer on their cached states
    drifted(trainer.model)
    twin = drifted(top_layer_lm(tiny_base)).eval()  # the same weights, without the trainer's opacus hooks
    base_model = AutoModelForCausalLM.from_pretrained(tiny_base).eval()
    loss = naive_anchor(twin, base_model, anchor, 0.7)
    assert loss.item() > 1e-4
    want = torch.autograd.grad(loss, [p for p in twin.parameters() if p.requires_grad])
    trainer.model.train()
    got = trainer._anchor_gradient(trainer.model)
    assert trainer.model.training  # the anchor reads both models in evaluation mode, then restores training
    for name, g, w in zip(trainer._param_names, got, want):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-4, msg=name)


def test_a_step_adds_the_anchor_after_the_noise_and_no_public_row_enters_a_clipped_sum(tmp_path, tiny_base):
    """Same dp_seed, same draw, same noise: the step's gradient with the anchor is the one without it plus ∇A."""
    grads, anchors = [], []
    for anchor_lambda in (0.0, 0.7):
        trainer, anchor = trainer_pair_inputs(tiny_base, tmp_path / str(anchor_lambda), anchor_lambda=0.7)
        trainer.anchor_lambda = anchor_lambda  # the same trainer otherwise: the anchor switched off or on
        drifted(trainer.model)
        trainer.create_optimizer()
        batch = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(8)]))
        anchors.append(trainer._anchor_gradient(trainer.model))
        trainer.training_step(trainer.model, batch)
        grads.append([p.grad.clone() for p in trainer._params])
        assert all(getattr(p, "grad_sample", None) is None for p in trainer._params)
    for name, without, with_anchor, a in zip(trainer._param_names, *grads, anchors[1]):
        torch.testing.assert_close(with_anchor - without, a, atol=1e-6, rtol=1e-4, msg=name)


def test_the_anchor_needs_its_rows_and_a_causal_lm(tmp_path, tiny_base):
    with pytest.raises(ValueError, match="needs the public anchor's rows"):
        make_trainer(tmp_path, model=lora_classifier(), dataset=text_dataset(), anchor_lambda=1.0)
    with pytest.raises(ValueError, match="anchor_lambda is 0"):
        trainer_pair_inputs(tiny_base, tmp_path, anchor_lambda=0.0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_base)
    rows = anchor_rows(top_layer_lm(tiny_base), tokenizer, PROMPTS[:2], max_new_tokens=2)
    with pytest.raises(ValueError, match="for causal LMs"):
        DPSAMTrainer(model=lora_classifier(), args=trainer_config(tmp_path, anchor_lambda=1.0),
                     train_dataset=text_dataset().map(lambda b: tokenizer(b["text"]), batched=True,
                                                       remove_columns=["text"]), anchor_rows=rows)
    with pytest.raises(ValueError, match="anchor_lambda must be a finite number"):
        trainer_config(tmp_path, anchor_lambda=-1.0)
    with pytest.raises(ValueError, match="anchor_max_new_tokens"):
        anchor_rows(top_layer_lm(tiny_base), tokenizer, PROMPTS, max_new_tokens=0)


def test_the_classifier_script_refuses_the_anchor_before_writing_anything(tmp_path):
    from hf_dpmerge.scripts.train import main as train_glue

    with pytest.raises(ValueError, match="--anchor_lambda is not used by train_glue.py"):
        train_glue(["--task", "rotten_tomatoes", "--runs_dir", str(tmp_path / "runs"), "--anchor_lambda", "1"])
    assert not (tmp_path / "runs").exists()


def test_public_prompts_packaged_or_a_users_file_and_bad_files_are_refused(tmp_path):
    packaged = load_public_prompts(PACKAGED)
    assert len(packaged) >= 40 and len(set(packaged)) == len(packaged)
    lines = tmp_path / "prompts.txt"
    lines.write_text("First question?\n\n  Second question?  \n")
    assert load_public_prompts(str(lines)) == ["First question?", "Second question?"]
    listed = tmp_path / "prompts.json"
    listed.write_text(json.dumps(["One?", "Two?"]))
    assert load_public_prompts(str(listed)) == ["One?", "Two?"]
    assert prompts_digest(["One?", "Two?"]) != prompts_digest(["One?", "Three?"])
    with pytest.raises(FileNotFoundError, match="--anchor_prompts"):
        load_public_prompts(str(tmp_path / "missing.txt"))
    listed.write_text(json.dumps(["One?", 2]))
    with pytest.raises(ValueError, match="list of non-empty strings"):
        load_public_prompts(str(listed))
    lines.write_text("\n \n")
    with pytest.raises(ValueError, match="holds no prompt"):
        load_public_prompts(str(lines))


def test_the_script_trains_with_the_anchor_and_the_record_names_its_prompts_not_a_path(tmp_path, tiny_base):
    from hf_dpmerge.scripts.train_causal_lm import main as train_causal_lm

    prompts = tmp_path / "my_prompts.txt"
    prompts.write_text("\n".join(PROMPTS))
    runs = tmp_path / "runs"
    tiny = ["--task", "rotten_tomatoes", "--model_name_or_path", str(tiny_base), "--runs_dir", str(runs),
            "--max_train_samples", "32", "--max_eval_samples", "8", "--per_device_train_batch_size", "8",
            "--physical_batch_size", "4", "--max_steps", "2", "--lora_r", "2", "--max_length", "48",
            "--accountant", "rdp", "--use_cpu", "true", "--lora_layers", "top_1"]
    with pytest.raises(ValueError, match="--anchor_prompts is read only by the public anchor"):
        train_causal_lm([*tiny, "--anchor_prompts", str(prompts)])
    assert not (runs / "rotten_tomatoes").exists()  # refused before anything was trained or written
    train_causal_lm([*tiny, "--anchor_lambda", "0.5", "--anchor_prompts", str(prompts), "--anchor_max_new_tokens",
                     "4"])
    adapter = runs / "rotten_tomatoes" / "adapter"
    anchor = PrivacyRecord.load(adapter).extra["public_anchor"]
    assert anchor["lambda"] == 0.5 and anchor["rows"] == len(PROMPTS) and anchor["max_new_tokens"] == 4
    assert anchor["prompts"] == "a file of the user's" and anchor["prompts_sha256"] == prompts_digest(PROMPTS)
    assert len(PROMPTS) <= anchor["answer_tokens"] <= 4 * len(PROMPTS)
    assert str(tmp_path) not in (adapter / "dp_privacy.json").read_text()
