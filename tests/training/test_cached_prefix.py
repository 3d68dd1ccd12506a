"""Training on a cached prefix is the same mechanism as training the whole model: with dropout off in the frozen
bottom, the clipped sums, the noised steps and the final weights of a seeded run equal the uncached run's, on a
tiny BERT classifier and a tiny Llama causal LM, in every SAM mode, with the alignment penalty and user-level
units; the record says a cache was used."""

import dataclasses
import fnmatch

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import (
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    DataCollatorWithPadding,
    LlamaForSequenceClassification,
)

from hf_dpmerge.data.instructions import IGNORE_INDEX, tokenize_instructions
from hf_dpmerge.data.tasks import get_task_spec
from hf_dpmerge.modeling.per_example_loss import per_example_loss
from hf_dpmerge.modeling.pooled_features import task_head
from hf_dpmerge.modeling.prefix_split import trainable_boundary
from hf_dpmerge.records.release_files import RELEASE_ALLOW_LIST
from hf_dpmerge.training.cached_prefix import CachedPrefixTrainer, collate_prefix_rows, dp_trainer, prefix_boundary
from hf_dpmerge.training.dp.micro_batches import micro_batches
from hf_dpmerge.training.dpsam_trainer import DPSAMTrainer
from hf_dpmerge.training.lora_causal_lm import lora_causal_lm
from hf_dpmerge.training.lora_classifier import lora_layer_indices
from tests.training.test_causal_lm_training import reviews
from tests.utils.tiny_models import save_tiny_llama, tiny_llama, tiny_tokenizer
from tests.utils.training_helpers import (
    head_only_classifier,
    lora_classifier,
    make_cached_trainer,
    make_trainer,
    silenced,
    text_dataset,
    trainer_config,
    unit_dataset,
)

ATOL = 1e-6


def top_layer_classifier():
    """The tiny BERT (2 layers, no dropout) with LoRA on the top layer only: the bottom layer is frozen."""
    return lora_classifier(layers_to_transform=[1])


def pair(tmp_path, build_model, dataset, collator, **overrides):
    """(uncached, cached) trainers on identical models, data and settings (same dp_seed: same draws and noise)."""
    trainers = []
    for kind, cls in (("full", DPSAMTrainer), ("cached", CachedPrefixTrainer)):
        extra = {"cache_dtype": "float32"} if cls is CachedPrefixTrainer else {}
        trainers.append(silenced(lambda cls=cls, kind=kind, extra=extra, **settings: cls(
            model=build_model(), args=trainer_config(tmp_path / kind, **settings), train_dataset=dataset,
            data_collator=collator, **extra), overrides))
    return trainers


def trained_weights(trainer):
    trainer.train()
    return [p.detach().clone() for p in trainer._params]


def assert_same_weights(full, cached):
    assert full._param_names == cached._param_names
    for name, want, got in zip(full._param_names, trained_weights(full), trained_weights(cached)):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0, msg=name)


def test_the_boundary_is_the_lowest_trainable_layer():
    model = top_layer_classifier()
    head = model.get_base_model().classifier
    assert trainable_boundary(model, head) == 1
    assert prefix_boundary(model) == (1, "")
    assert prefix_boundary(lora_classifier())[0] is None  # LoRA on layer 0: nothing frozen to cache


def test_clipped_sum_equals_the_full_models(tmp_path):
    """Same rows, no noise, C small enough to clip every example: the released sums agree."""
    settings = dict(noise_multiplier=0.0, per_sample_max_grad_norm=0.01, sam_mode="none", physical_batch_size=3)
    full, cached = pair(tmp_path, top_layer_classifier, text_dataset(), DataCollatorWithPadding(tiny_tokenizer()),
                        **settings)
    rows = [0, 3, 4, 7, 8, 11, 17]
    tokens = full.train_dataset.remove_columns(["text"])
    want, want_loss = full._query(full.model, full._prepare_inputs(full.data_collator([tokens[i] for i in rows])))
    got, got_loss = cached._query(cached.model, cached._prepare_inputs(
        collate_prefix_rows([cached.train_dataset[i] for i in rows])))
    for name, g, w in zip(full._param_names, got, want):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=0, msg=name)
    torch.testing.assert_close(got_loss, want_loss, atol=ATOL, rtol=0)


@pytest.mark.parametrize("sam_mode", ["none", "dp_sat", "two_query", "per_example"])
def test_seeded_cached_run_ends_at_the_full_runs_weights(tmp_path, sam_mode):
    full, cached = pair(tmp_path, top_layer_classifier, text_dataset(), DataCollatorWithPadding(tiny_tokenizer()),
                        sam_mode=sam_mode, align_lambda=0.1, max_steps=3, noise_multiplier=1.0)
    assert_same_weights(full, cached)
    assert cached.privacy_record().epsilon == pytest.approx(full.privacy_record().epsilon)


def test_user_level_cached_run_ends_at_the_full_runs_weights(tmp_path):
    full, cached = pair(tmp_path, top_layer_classifier, unit_dataset(), DataCollatorWithPadding(tiny_tokenizer()),
                        privacy_unit_column="author", per_device_train_batch_size=8, max_steps=3)
    assert_same_weights(full, cached)


def test_head_only_cached_run_ends_at_the_full_runs_weights(tmp_path):
    """b = L: the cached rows are the head's pooled input (the head-only floor)."""
    full, cached = pair(tmp_path, head_only_classifier, text_dataset(), DataCollatorWithPadding(tiny_tokenizer()),
                        max_steps=3, sam_mode="two_query")
    assert cached.top_layers == 0 and cached.train_dataset.states.shape == (len(text_dataset()), 32)
    assert_same_weights(full, cached)


def test_the_last_token_is_the_stock_decoders_and_needs_a_pad_token_for_padded_rows():
    from hf_dpmerge.modeling.pooled_features import last_token_index

    ids = torch.tensor([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9], [0, 5, 0, 0, 0]])
    assert last_token_index(ids, pad_token_id=0).tolist() == [2, 4, 1]
    assert last_token_index(ids[:1], pad_token_id=None).tolist() == [4]
    with pytest.raises(ValueError, match="pad_token_id"):
        last_token_index(ids, pad_token_id=None)


def instruction_rows(tmp_path, train_answer_end: bool = True):
    base = save_tiny_llama(tmp_path / "base")
    tokenizer = AutoTokenizer.from_pretrained(base)
    rows = tokenize_instructions(reviews(), get_task_spec("rotten_tomatoes"), tokenizer, max_length=40,
                                 train_answer_end=train_answer_end)
    return base, rows, DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX)


@pytest.mark.parametrize(("sam_mode", "train_answer_end"), [("none", True), ("per_example", True), ("none", False)])
def test_causal_cached_run_ends_at_the_full_runs_weights(tmp_path, sam_mode, train_answer_end):
    """LM loss on the answer tokens; the LM head at the answer positions only (every position per_example), the
    verbaliser's alone when the answer's end is left out of the loss."""
    base, rows, collator = instruction_rows(tmp_path, train_answer_end)

    def top_layer_lm():
        torch.manual_seed(0)  # the same LoRA A draw in both runs
        return lora_causal_lm(base, r=4, alpha=8, target_modules=["q_proj", "v_proj"], layers="1")

    full, cached = pair(tmp_path, top_layer_lm, rows, collator, max_steps=3, per_device_train_batch_size=8,
                        sam_mode=sam_mode)
    assert cached.boundary == 1 and cached.causal
    assert_same_weights(full, cached)


def test_record_states_the_cache(tmp_path):
    _, cached = pair(tmp_path, top_layer_classifier, text_dataset(), DataCollatorWithPadding(tiny_tokenizer()))
    extra = cached._record_extra()["cached_prefix"]
    assert extra["boundary_layer"] == 1 and extra["top_layers"] == 1 and extra["cache_dtype"] == "float32"
    assert "lm_head" not in extra and "head_reads" not in extra  # an encoder's head pools the whole row


def test_half_precision_cache_stays_close(tmp_path):
    """float16 storage (the default), float32 compute: the clipped sum moves by no more than storage rounding."""
    settings = dict(noise_multiplier=0.0, sam_mode="none")
    full, cached = pair(tmp_path, top_layer_classifier, text_dataset(), DataCollatorWithPadding(tiny_tokenizer()),
                        **settings)
    half = CachedPrefixTrainer(model=top_layer_classifier(), args=dataclasses.replace(
        cached.args, output_dir=str(tmp_path / "half")), train_dataset=text_dataset(),
        data_collator=DataCollatorWithPadding(tiny_tokenizer()))
    half.privatizer.noise_multiplier = 0.0
    assert half.train_dataset.states.dtype == torch.float16
    rows = list(range(20))
    want, _ = cached._query(cached.model, collate_prefix_rows([cached.train_dataset[i] for i in rows]))
    got, _ = half._query(half.model, collate_prefix_rows([half.train_dataset[i] for i in rows]))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-2)


def test_micro_batches_are_formed_by_length_and_trimmed():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]])
    features = {"input_ids": torch.arange(16).view(4, 4) * mask, "attention_mask": mask}
    labels = torch.tensor([0, 1, 2, 3])
    batches = list(micro_batches(features, labels, 2))
    assert [b[2].tolist() for b in batches] == [[1, 3], [0, 2]]
    assert [b[0]["input_ids"].shape[1] for b in batches] == [4, 2]
    assert batches[1][1].tolist() == [0, 2]
    left = {"attention_mask": mask.flip(1)}  # left padding: kept in draw order, untrimmed
    assert [b[2].tolist() for b in micro_batches(left, labels, 2)] == [[0, 1], [2, 3]]


def test_cached_per_sample_gradients_are_clipped_to_c(tmp_path):
    c = 0.02
    trainer = make_cached_trainer(tmp_path, noise_multiplier=0.0, per_sample_max_grad_norm=c, sam_mode="none")
    rows = list(range(12))
    batch = trainer._prepare_inputs(collate_prefix_rows([trainer.train_dataset[i] for i in rows]))
    weight, bias = (p.detach().clone().requires_grad_() for p in trainer._params)  # the head, outside opacus
    assert weight.shape == task_head(trainer.model).weight.shape
    norms, expected = [], [torch.zeros_like(weight), torch.zeros_like(bias)]
    for i in rows:
        logits = torch.nn.functional.linear(batch["inputs_embeds"][i : i + 1, 0], weight, bias)
        grads = torch.autograd.grad(per_example_loss(logits, batch["labels"][i : i + 1]).sum(), (weight, bias))
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        norms.append(norm.item())
        for total, g in zip(expected, grads):
            total.add_(g * min(1.0, c / (norm.item() + 1e-6)))
    assert max(norms) > c  # clipping is exercised
    released, _ = trainer._query(trainer.model, batch)
    for got, want in zip(released, expected):
        torch.testing.assert_close(got, want / trainer.expected_batch_size, rtol=1e-5, atol=1e-9)


def test_cached_training_spends_the_accountants_epsilon_and_releases_a_head_only_adapter(tmp_path):
    from opacus.accountants import create_accountant

    trainer = make_cached_trainer(tmp_path, max_steps=30, target_epsilon=2.0, logging_steps=30)
    lora_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if ".lora_" in n}
    head_before = [p.detach().clone() for p in trainer._params]
    trainer.train()
    accountant = create_accountant("rdp")
    accountant.history = [(trainer.noise_multiplier, trainer.sample_rate, 30)]
    record = trainer.privacy_record()
    assert record.steps == 30 and record.epsilon == pytest.approx(accountant.get_epsilon(trainer.delta), rel=1e-9)
    assert record.epsilon <= 2.0
    assert all(torch.equal(p, lora_before[n]) for n, p in trainer.model.named_parameters() if ".lora_" in n)
    assert all(not torch.equal(p, before) for p, before in zip(trainer._params, head_before))
    trainer.save_model(str(tmp_path / "release"))
    assert (tmp_path / "release" / "adapter_model.safetensors").exists()
    assert (tmp_path / "release" / "dp_privacy.json").exists()


def test_a_trainable_lowest_layer_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no cached prefix: the lowest layer is trainable.*--cache_prefix false"):
        make_cached_trainer(tmp_path, model=lora_classifier())


def test_frozen_lora_with_alignment_trains_and_records_no_alignment(tmp_path):
    """The default recipe's λ > 0 on a model whose LoRA factors are all frozen: R(w) has nothing to act on, so
    it is skipped (before: autograd.grad over frozen factors raised) and the record says λ = 0."""
    trainer = make_trainer(tmp_path, model=head_only_classifier(), align_lambda=0.05, sam_mode="dp_sat", max_steps=2)
    trainer.train()
    assert trainer.state.global_step == 2 and trainer.privacy_record().align_lambda == 0.0
    assert make_trainer(tmp_path / "lora", align_lambda=0.05).align_lambda == 0.05  # trainable LoRA: kept


def test_dp_trainer_caches_when_asked_or_when_valid(tmp_path):
    kwargs = dict(train_dataset=text_dataset(), data_collator=DataCollatorWithPadding(tiny_tokenizer()))
    args = trainer_config(tmp_path)
    assert type(dp_trainer(top_layer_classifier(), args, **kwargs)) is CachedPrefixTrainer  # auto, valid
    assert type(dp_trainer(top_layer_classifier(), args, cache_prefix="false", **kwargs)) is DPSAMTrainer
    assert type(dp_trainer(lora_classifier(), args, **kwargs)) is DPSAMTrainer  # auto, nothing frozen
    with pytest.raises(ValueError, match="--cache_prefix true: the lowest layer is trainable"):
        dp_trainer(lora_classifier(), args, cache_prefix="true", **kwargs)
    with pytest.raises(ValueError, match="--cache_prefix must be one of"):
        dp_trainer(lora_classifier(), args, cache_prefix="yes", **kwargs)


def test_top_k_lora_layers():
    assert lora_layer_indices("top_2", 6) == [4, 5] and lora_layer_indices("top_half", 6) == [3, 4, 5]
    with pytest.raises(ValueError, match="top_K needs 1 ≤ K ≤ 6"):
        lora_layer_indices("top_7", 6)


def test_a_resumed_cached_run_rebuilds_its_cache_and_ends_at_the_uninterrupted_weights(tmp_path):
    settings = dict(max_steps=6, save_strategy="steps", save_steps=3, sam_mode="dp_sat", sam_rho=0.1)
    full = make_cached_trainer(tmp_path / "full", model=top_layer_classifier(), **settings)
    full.train()
    make_cached_trainer(tmp_path / "part", model=top_layer_classifier(), **settings).train()
    resumed = make_cached_trainer(tmp_path / "part", model=top_layer_classifier(), **settings)
    resumed.train(resume_from_checkpoint=str(tmp_path / "part" / "out" / "checkpoint-3"))
    assert resumed.accountant.steps == 6
    assert resumed.accountant.epsilon() == pytest.approx(full.accountant.epsilon(), rel=1e-12)
    for a, b in zip(resumed._params, full._params):
        torch.testing.assert_close(a, b, rtol=0, atol=ATOL)


def test_a_cached_release_ships_its_noise_statistics_and_no_cached_state(tmp_path):
    trainer = make_cached_trainer(tmp_path, model=top_layer_classifier(), max_steps=3)
    trainer.train()
    trainer.save_model(str(tmp_path / "release"))
    released = sorted(p.name for p in (tmp_path / "release").iterdir())
    assert "dp_noise_stats.safetensors" in released and "dp_privacy.json" in released
    assert all(any(fnmatch.fnmatch(name, allowed) for allowed in RELEASE_ALLOW_LIST) for name in released)
    assert not list(tmp_path.rglob("*.npy")) and not list(tmp_path.rglob("*cache*"))  # the states stay in memory


def lora_llama_classifier():
    """A tiny Llama sequence classifier (pad = the tokenizer's) with LoRA on its top layer's q_proj; the ``score``
    head trains too (peft's SEQ_CLS ``modules_to_save``)."""
    torch.manual_seed(0)
    config = tiny_llama(initializer_range=0.5).config
    config.num_labels, config.pad_token_id = 2, tiny_tokenizer().pad_token_id
    return get_peft_model(LlamaForSequenceClassification(config),
                          LoraConfig(r=2, target_modules=["q_proj"], layers_to_transform=[1], task_type="SEQ_CLS"))


def test_a_decoder_classifiers_lora_cached_run_ends_at_the_full_runs_weights(tmp_path):
    """Below b = L on a decoder: each row is cached up to its last non-padding token and the head reads the top's
    state there, so the stock model's steps (its own pooling, by input id, on right-padded batches of unequal
    lengths) and the cached ones agree, also for rows whose real tokens end in the pad token (the stock head then
    reads an earlier position; a cache that kept every real token would not)."""
    pad = tiny_tokenizer().pad_token_id
    ending_in_pad = text_dataset().map(lambda row, i: {k: row[k] + [pad if k == "input_ids" else 1] * (i % 3 == 0)
                                                       for k in ("input_ids", "attention_mask")}, with_indices=True)
    full, cached = pair(tmp_path, lora_llama_classifier, ending_in_pad, DataCollatorWithPadding(tiny_tokenizer()),
                        max_steps=3, physical_batch_size=7, learning_rate=0.05)
    assert prefix_boundary(full.model)[0] == 1 and cached.top_layers == 1
    lengths = [len(ids) for ids in ending_in_pad["input_ids"]]
    cached_lengths = (cached.train_dataset.offsets[1:] - cached.train_dataset.offsets[:-1]).tolist()
    assert cached_lengths == [n - (i % 3 == 0) for i, n in enumerate(lengths)]  # up to the stock head's token
    assert any(".lora_B." in name for name in cached._param_names)
    assert any(".score." in name for name in cached._param_names)
    assert cached._record_extra()["cached_prefix"]["head_reads"] == "the last non-padding token"
    assert_same_weights(full, cached)


def head_only_llama_classifier():
    """A tiny Llama sequence classifier (pad = the tokenizer's) with frozen LoRA: only its ``score`` head trains."""
    torch.manual_seed(0)
    config = tiny_llama(initializer_range=0.5).config
    config.num_labels, config.pad_token_id = 2, tiny_tokenizer().pad_token_id
    model = get_peft_model(LlamaForSequenceClassification(config),
                           LoraConfig(r=2, target_modules=["q_proj"], task_type="SEQ_CLS"))
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(".score." in name and "modules_to_save" in name)
    return model


def test_a_decoder_classifiers_head_only_cached_run_ends_at_the_full_runs_weights(tmp_path):
    """b = L on a decoder: the cached row is the state at its last non-padding token (right-padded batches of
    unequal lengths), so the stock model's own pooling and the cache give the same steps."""
    full, cached = pair(tmp_path, head_only_llama_classifier, text_dataset(), DataCollatorWithPadding(tiny_tokenizer()),
                        max_steps=3, physical_batch_size=7)
    assert cached.top_layers == 0 and cached.train_dataset.states.shape == (len(text_dataset()), 32)
    assert len(set(len(ids) for ids in text_dataset()["input_ids"])) > 1  # padding is exercised
    assert_same_weights(full, cached)


def test_a_prefix_cache_dir_is_reused_by_a_later_run_and_keyed_by_the_bottom(tmp_path, monkeypatch):
    """The second run on the same data and base reads the stored states (no bottom pass) and ends at the weights
    of a run that built them; a changed bottom weight misses the stored file and builds its own."""
    import hf_dpmerge.training.cached_prefix as cached_prefix

    builds = []
    build = cached_prefix.build_prefix_rows
    monkeypatch.setattr(cached_prefix, "build_prefix_rows", lambda *a, **k: builds.append(1) or build(*a, **k))
    store, dataset, collator = tmp_path / "prefix", text_dataset(), DataCollatorWithPadding(tiny_tokenizer())

    def run(name, model):
        trainer = silenced(lambda **s: CachedPrefixTrainer(
            model=model, args=trainer_config(tmp_path / name, **s), train_dataset=dataset, data_collator=collator,
            cache_dtype="float32", prefix_cache_dir=store), {"max_steps": 3, "noise_multiplier": 1.0})
        return trainer, trained_weights(trainer)

    first, first_weights = run("first", top_layer_classifier())
    second, second_weights = run("second", top_layer_classifier())
    assert len(builds) == 1 and len(list(store.glob("prefix-*.pt"))) == 1 and not list(store.glob("*.partial"))
    torch.testing.assert_close(second.train_dataset.states, first.train_dataset.states, atol=0, rtol=0)
    for want, got in zip(first_weights, second_weights):
        torch.testing.assert_close(got, want, atol=0, rtol=0)

    changed = top_layer_classifier()
    with torch.no_grad():
        changed.get_base_model().bert.encoder.layer[0].output.dense.weight.add_(0.1)
    run("changed", changed)
    assert len(builds) == 2 and len(list(store.glob("prefix-*.pt"))) == 2


def test_a_prefix_cache_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="--prefix_cache_dir .*: exists and is not a directory"):
        CachedPrefixTrainer(model=top_layer_classifier(), args=trainer_config(tmp_path / "run"),
                            train_dataset=text_dataset(), data_collator=DataCollatorWithPadding(tiny_tokenizer()),
                            prefix_cache_dir=tmp_path / "file")
