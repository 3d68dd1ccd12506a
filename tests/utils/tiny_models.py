"""Tiny random models built from configs, with a tokenizer trained in-process: no downloads."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

CORPUS = [
    "the film was a delight from start to finish",
    "a dull and lifeless script with wooden acting",
    "markets rallied as oil prices fell sharply",
    "the central bank kept interest rates unchanged",
    "an inspired cast lifts this quiet comedy",
    "shares of the company dropped after weak earnings",
    "i would not watch this again",
    "exports grew faster than analysts expected",
]


# the words of the instruction prompts and verbalisers of hf_dpmerge.data.instructions, for tiny causal LMs
INSTRUCTION_WORDS = [
    "review : is this review fresh or rotten ? answer :",
    "tweet : was this tweet written by clinton or trump ?",
]


def tiny_tokenizer(corpus: list[str] = CORPUS, eos: bool = False) -> PreTrainedTokenizerFast:
    """A word-level tokenizer of ``corpus``'s words (``eos``: with an ``[EOS]`` end-of-sequence token)."""
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(["[EOS]"] if eos else [])]
    tok.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=specials))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        **({"eos_token": "[EOS]"} if eos else {}),
    )


def tiny_causal_tokenizer() -> PreTrainedTokenizerFast:
    """The tiny tokenizer with the instruction words and an end-of-sequence token (no chat template)."""
    return tiny_tokenizer(CORPUS + INSTRUCTION_WORDS, eos=True)


def tiny_bert(num_labels: int = 2, seed: int = 0, dropout: float = 0.0) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(tiny_tokenizer()),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=48,
        max_position_embeddings=64,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        num_labels=num_labels,
    )
    return BertForSequenceClassification(config)


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(tiny_tokenizer()),
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config)


def tiny_llama(seed: int = 0, initializer_range: float = 0.02) -> LlamaForCausalLM:
    """A 2-layer random Llama (grouped-query attention, untied embeddings) over the tiny causal tokenizer. At the
    default ``initializer_range`` its logits stay near uniform (a 32-wide normed state times 0.02-scale weights) and
    LoRA on the blocks cannot make an answer confident; 0.5 lets a trained adapter do so."""
    torch.manual_seed(seed)
    tokenizer = tiny_causal_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=None,  # the tokenizer's special tokens, so that generation stops at its [EOS]
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        initializer_range=initializer_range,
    )
    return LlamaForCausalLM(config)


def save_tiny_llama(directory: Path, seed: int = 0, initializer_range: float = 0.02) -> Path:
    """Save a tiny random Llama and its tokenizer, loadable with AutoModelForCausalLM / AutoTokenizer."""
    tiny_llama(seed, initializer_range).save_pretrained(directory)
    tiny_causal_tokenizer().save_pretrained(directory)
    return directory


def save_tiny_bert(directory: Path, num_labels: int = 2, seed: int = 0) -> Path:
    """Save a tiny BERT sequence classifier and its tokenizer, loadable with from_pretrained."""
    model = tiny_bert(num_labels=num_labels, seed=seed)
    model.save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return directory
