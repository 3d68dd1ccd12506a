"""The causal recipe search: candidates parse as the causal script runs them, the choice reads the select task's
validation split only, and the report scores the chosen recipe against zero-shot on test."""

import json
from pathlib import Path

import pytest

from benchmarks import causal_recipe
from hf_dpmerge.scripts.train import parse_arguments
from hf_dpmerge.scripts.train_causal_lm import CAUSAL_DP_DEFAULTS, SCRIPT, CausalScriptArguments


def parsed(candidate: str, split: str = "validation", epsilon: float = 8.0):
    argv = causal_recipe.unit_argv("bbc_news", candidate, split, epsilon, 0, Path("/cache"))
    return parse_arguments(argv, CausalScriptArguments, CAUSAL_DP_DEFAULTS, SCRIPT)


@pytest.mark.parametrize("candidate", list(causal_recipe.CANDIDATES))
def test_every_candidate_is_a_private_cached_prefix_run_of_the_causal_script(candidate):
    script, config = parsed(candidate)
    assert config.dp and config.target_epsilon == 8 and config.per_sample_max_grad_norm == 1.0
    assert script.lora_layers == "top_4" and script.cache_prefix == "true" and script.eval_split == "validation"
    assert config.lr_scheduler_type == "constant"
    assert config.sam_mode == "none" and config.align_lambda == 0  # plain DP-SGD
    passes = config.per_device_train_batch_size * config.max_steps  # ≈ 10k example passes (full batch: ≈ 19k)
    assert passes == 10240 or (config.per_device_train_batch_size == 1600 and passes <= 20000)


def test_an_infinite_epsilon_runs_the_candidate_without_privacy():
    chosen = "b1600_t12_lr1e-2"
    (private_script, private), (plain_script, plain) = parsed(chosen, "test"), parsed(chosen, "test", float("inf"))
    assert private.dp and not plain.dp and plain.sam_mode == "none" and plain.align_lambda == 0
    assert plain.dataloader_drop_last  # batches of the expected size, never a remainder of a few rows
    for field in ("per_device_train_batch_size", "max_steps", "learning_rate", "lr_scheduler_type", "seed"):
        assert getattr(plain, field) == getattr(private, field)
    assert plain_script.lora_layers == private_script.lora_layers and plain_script.eval_split == "test"


def test_the_dp_merging_variant_is_the_candidate_with_dp_sat_and_alignment():
    chosen = "b1600_t12_lr1e-2"
    (_, plain), (_, variant) = parsed(chosen, "test"), parsed(f"{chosen}+dp_merging", "test")
    assert plain.sam_mode == "none" and plain.align_lambda == 0
    assert variant.dp and variant.sam_mode == "dp_sat" and variant.sam_rho == 0.05 and variant.align_lambda == 0.05
    for field in ("per_device_train_batch_size", "max_steps", "learning_rate", "target_epsilon", "seed"):
        assert getattr(variant, field) == getattr(plain, field)


def test_the_full_batch_variant_draws_every_training_row_in_every_step():
    """q = 1 on any task: the expected batch is the task's training split (bbc_news: 1602 rows), the rest is the
    chosen candidate's."""
    chosen = "b1600_t12_lr1e-2"
    (_, plain), (_, full) = parsed(chosen, "test"), parsed(f"{chosen}+full_batch", "test")
    assert full.per_device_train_batch_size == causal_recipe.training_rows("bbc_news") == 1602
    assert plain.per_device_train_batch_size == 1600
    for field in ("max_steps", "learning_rate", "sam_mode", "align_lambda", "target_epsilon", "seed"):
        assert getattr(full, field) == getattr(plain, field)


def test_the_no_answer_end_variant_leaves_the_end_of_sequence_out_of_the_loss_and_nothing_else():
    chosen = "b1600_t12_lr1e-2"
    (plain_script, plain), (script, variant) = parsed(chosen, "test"), parsed(f"{chosen}+no_answer_end", "test")
    assert plain_script.train_answer_end and not script.train_answer_end
    assert variant.to_dict() == plain.to_dict()
    assert {**vars(script), "train_answer_end": True} == vars(plain_script)


def unit(candidate, score, task="bbc_news", split="validation", epsilon=8.0, seed=0):
    return {"task": task, "candidate": candidate, "split": split, "epsilon": epsilon, "seed": seed, "score": score,
            "seconds": 600.0, "noise_multiplier": 1.0, "sample_rate": 0.1}


def test_the_choice_waits_for_every_candidate_and_reads_validation_only():
    names = list(causal_recipe.CANDIDATES)
    units = [unit(c, 0.3 + 0.01 * i) for i, c in enumerate(names)]
    assert causal_recipe.chosen_candidate(units[:-1])[0] is None
    others = [unit(names[0], 0.99, split="test"), unit(names[0], 0.99, task="election_tweets"),
              unit(names[0], 0.99, epsilon=4.0), unit(causal_recipe.ZERO_SHOT, 0.99, epsilon=None)]
    chosen, scores = causal_recipe.chosen_candidate(units + others)
    assert chosen == names[-1] and scores[names[0]] == pytest.approx(0.3)


def test_the_report_gives_each_test_unit_its_gain_over_zero_shot(tmp_path: Path):
    names = list(causal_recipe.CANDIDATES)
    units = [unit(c, 0.3 + 0.01 * i) for i, c in enumerate(names)]
    units += [unit(causal_recipe.ZERO_SHOT, 0.25, split="test", epsilon=None),
              unit(causal_recipe.ZERO_SHOT, 0.55, task="election_tweets", split="test", epsilon=None),
              unit(names[-1], 0.40, split="test"), unit(names[-1], 0.60, task="election_tweets", split="test"),
              unit(causal_recipe.ZERO_SHOT, 0.28, epsilon=None)]
    text = causal_recipe.write_report(units, tmp_path / "CAUSAL_RECIPE.md")
    assert f"Chosen: `{names[-1]}`." in text and "Zero-shot base: 28.0." in text
    assert f"| bbc_news (select) | 8 | 0 | {names[-1]} | with the end | 25.0 | 40.0 | +15.0 |" in text
    assert f"| election_tweets | 8 | 0 | {names[-1]} | with the end | 55.0 | 60.0 | +5.0 | — |" in text
    units += [unit(names[-1], 0.55, split="test", epsilon=float("inf"))]
    text = causal_recipe.write_report(units, tmp_path / "CAUSAL_RECIPE.md")  # DP gain 15 of the non-private 30
    assert f"| bbc_news (select) | 8 | 0 | {names[-1]} | with the end | 25.0 | 40.0 | +15.0 | 50% |" in text
    assert f"| bbc_news (select) | ∞ (non-private) | 0 | {names[-1]} | with the end | 25.0 | 55.0 | +30.0 | — |" in text
    units += [unit(f"{names[-1]}+dp_merging", 0.37, split="test")]  # its share: of its candidate's non-private gain
    text = causal_recipe.write_report(units, tmp_path / "CAUSAL_RECIPE.md")
    assert f"| bbc_news (select) | 8 | 0 | {names[-1]}+dp_merging | with the end | 25.0 | 37.0 | +12.0 | 40% |" in text
    # scored on the verbaliser alone (trained without the answer's end): no floor scored that way here, and no
    # share of a gain measured with the end
    alone = {"answer_end_scored": False}
    units += [unit(f"{names[-1]}+no_answer_end", 0.5, split="test") | alone,
              unit(f"{names[-1]}+no_answer_end", 0.6, split="test", epsilon=float("inf")) | alone]
    text = causal_recipe.write_report(units, tmp_path / "CAUSAL_RECIPE.md")
    assert f"| bbc_news (select) | 8 | 0 | {names[-1]}+no_answer_end | verbaliser alone | — | 50.0 | — | — |" in text


def test_the_report_treats_each_seed_as_one_adapter_against_the_gain_target(tmp_path: Path):
    chosen = list(causal_recipe.CANDIDATES)[-1]
    units = [unit(causal_recipe.ZERO_SHOT, 0.25, split="test", epsilon=None),
             unit(chosen, 0.40, split="test"), unit(chosen, 0.30, split="test", seed=1),
             unit(chosen, 0.50, split="test", seed=2), unit(chosen, 0.45, split="test", epsilon=4.0),
             unit(chosen, 0.60, split="test", epsilon=float("inf")), unit(chosen, 0.60, split="test", seed=1,
                                                                         epsilon=float("inf"))]
    text = causal_recipe.write_report(units, tmp_path / "R.md")
    # gains +15, +5, +25 over the zero-shot 25: two of three seeds reach +10; ε = 4 and the non-private twin have one
    # and two seeds (the latter not private): no row
    assert f"| bbc_news | 8 | {chosen} | 0,1,2 | 40.0 30.0 50.0 | 40.0 | +15.0 (+5.0) | 2 of 3 |" in text
    assert text.count(f"| bbc_news | 8 | {chosen} |") == 1 and "| bbc_news | 4 |" not in text
    assert "| bbc_news | inf |" not in text and "| bbc_news | ∞" not in text
    alone = unit(chosen, 0.9, split="test", seed=3) | {"answer_end_scored": False}  # scored another way: left out
    assert "| 0,1,2 | 40.0 30.0 50.0 |" in causal_recipe.write_report(units + [alone], tmp_path / "R.md")


def test_the_anchor_variants_are_the_candidate_with_the_public_anchor_at_their_weight_and_nothing_else():
    chosen = "b1600_t12_lr1e-2"
    plain_script, plain = parsed(chosen)
    for variant, mu in causal_recipe.ANCHOR_GRID.items():
        script, anchored = parsed(f"{chosen}+{variant}")
        assert anchored.anchor_lambda == mu > 0 == plain.anchor_lambda
        assert {**anchored.to_dict(), "anchor_lambda": 0.0} == plain.to_dict()
        assert vars(script) == vars(plain_script)


def test_the_anchor_weight_is_chosen_on_the_select_tasks_validation_split_once_every_weight_is_stored(tmp_path):
    chosen = "b1600_t12_lr1e-2"
    names = list(causal_recipe.CANDIDATES)
    units = [unit(c, 0.5 if c == chosen else 0.3) for c in names]
    grid = [unit(f"{chosen}+{variant}", score) for variant, score in zip(causal_recipe.ANCHOR_GRID, (0.6, 0.7))]
    assert causal_recipe.chosen_anchor(units + grid[:-1], chosen)[0] is None
    decoys = [unit(f"{chosen}+{variant}", 0.99, split="test") for variant in causal_recipe.ANCHOR_GRID]
    decoys += [unit(f"{chosen}+{variant}", 0.99, task="election_tweets") for variant in causal_recipe.ANCHOR_GRID]
    assert causal_recipe.chosen_candidate(units + grid)[0] == chosen  # an anchored unit is no select candidate
    mu, scores = causal_recipe.chosen_anchor(units + grid + decoys, chosen)
    assert mu == max(causal_recipe.ANCHOR_GRID.values()) and scores[0.0] == 0.5
    tied = [unit(f"{chosen}+{variant}", 0.5) for variant in causal_recipe.ANCHOR_GRID]
    assert causal_recipe.chosen_anchor(units + tied, chosen)[0] == 0.0  # a tie keeps the smaller weight
    text = causal_recipe.write_report(units + grid, tmp_path / "R.md")
    assert "| 0 | 50.0 | 10.0 |" in text and "| 3 | 70.0 | 10.0 |" in text and "Chosen: μ = 3." in text


def test_the_anchor_stage_trains_each_weight_on_the_select_tasks_validation_split(tmp_path, monkeypatch):
    names = list(causal_recipe.CANDIDATES)
    units_dir = tmp_path / "units"
    units_dir.mkdir()
    for i, name in enumerate(names):
        (units_dir / f"{causal_recipe.unit_name('bbc_news', name, 'validation', 8.0, 0)}.json").write_text(
            json.dumps(unit(name, 0.3 + 0.01 * i)))
    calls = []
    monkeypatch.setattr(causal_recipe, "run_unit", lambda work_dir, task, candidate, split, epsilon, seed, *_: (
        calls.append((task, candidate, split, epsilon, seed)) or unit(candidate, 0.4)))
    monkeypatch.setattr(causal_recipe, "write_report", lambda units, path: "")
    assert causal_recipe.main(["--stage", "anchor", "--work-dir", str(tmp_path / "work"),
                               "--units-dir", str(units_dir)]) == 0
    assert calls == [("bbc_news", f"{names[-1]}+{variant}", "validation", 8.0, 0)
                     for variant in causal_recipe.ANCHOR_GRID]


def test_the_script_default_is_the_chosen_candidate():
    """``CAUSAL_DP_DEFAULTS`` is the recipe the stored select units chose (rerun the search, then move the default)."""
    chosen, _ = causal_recipe.chosen_candidate(causal_recipe.load_units(causal_recipe.REPORT_DIR / "units"))
    script, config = parsed(chosen)
    default_script, default_config = parse_arguments(["--task", "bbc_news"], CausalScriptArguments,
                                                     CAUSAL_DP_DEFAULTS, SCRIPT)
    for name in ("lora_layers", "lora_r", "lora_alpha", "lora_freeze_a", "lora_target_modules", "max_length"):
        assert getattr(default_script, name) == getattr(script, name), name
    for name in ("per_device_train_batch_size", "max_steps", "learning_rate", "lr_scheduler_type", "weight_decay",
                 "per_sample_max_grad_norm", "sam_mode", "align_lambda", "target_epsilon"):
        assert getattr(default_config, name) == getattr(config, name), name
    assert default_script.cache_prefix in ("auto", "true")  # the bottom is frozen: auto caches it


def test_the_full_runs_recipe_keeps_its_meaning_under_the_new_defaults():
    from benchmarks.causal_runs import NON_PRIVATE, RECIPE

    _, dp = parse_arguments([*RECIPE, "--target_epsilon", "8"], CausalScriptArguments, CAUSAL_DP_DEFAULTS, SCRIPT)
    assert (dp.per_device_train_batch_size, dp.max_steps, dp.learning_rate) == (64, 200, 3e-3)
    assert dp.sam_mode == "dp_sat" and dp.align_lambda == 0.05 and dp.dp
    _, plain = parse_arguments([*RECIPE, *NON_PRIVATE], CausalScriptArguments, CAUSAL_DP_DEFAULTS, SCRIPT)
    assert not plain.dp and plain.sam_mode == "none" and plain.align_lambda == 0


def test_the_report_lists_each_kept_adapters_stock_generation(tmp_path: Path, monkeypatch):
    generation = tmp_path / "generation"
    generation.mkdir()
    monkeypatch.setattr(causal_recipe, "GENERATION_DIR", generation)
    (generation / "bbc_news-b1600_t12_lr1e-2-test-eps8-seed0.json").write_text(
        '{"unit": "bbc_news-b1600_t12_lr1e-2-test-eps8-seed0", "task": "bbc_news", "n": 200, '
        '"generation_is_ranked_first": 0.25, "generation_is_gold": 0.2, "generation_is_a_verbaliser": 0.5, '
        '"examples": [{"answer": "sports", "gold": "business"}, {"answer": "", "gold": "tech"}]}')
    text = causal_recipe.write_report([unit(causal_recipe.ZERO_SHOT, 0.28, epsilon=None)], tmp_path / "R.md")
    assert "## Stock generation of each adapter alone" in text
    assert "| bbc_news-b1600_t12_lr1e-2-test-eps8-seed0 | 200 | 25% | 20% | 50% | 'sports', '' |" in text


@pytest.mark.parametrize(("answer", "leading"), [
    ("crude oil", 1), ("crude oil.", 1), ("crude oil prices", 1), ("crude", 0), ("crude, then", 0),
    ("crudeness", None), ("", None), ("grain", 2), ("Grain", None)])
def test_the_leading_verbaliser_is_the_longest_whole_word_prefix(answer, leading):
    from benchmarks.causal_runs import leading_verbaliser

    assert leading_verbaliser(answer, ["crude", "crude oil", "grain"]) == leading


def test_generation_scores_count_an_answer_that_ends_at_once_as_empty():
    """A model whose first greedy token is always the end of sequence answers with empty strings; the stored share
    and mean log-probability of that token at the answer's first position say so (here: a bias on its logit)."""
    import math

    import torch

    from benchmarks.causal_runs import generation_scores
    from tests.utils.tiny_models import tiny_causal_tokenizer, tiny_llama

    tokenizer = tiny_causal_tokenizer()
    tokenizer.chat_template = ("{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}Answer: {% endif %}")
    model = tiny_llama(initializer_range=0.5).eval()
    vocabulary, end = model.config.vocab_size, tokenizer.eos_token_id
    ends = torch.nn.Linear(model.config.hidden_size, vocabulary, bias=True)
    with torch.no_grad():
        ends.weight.zero_()
        ends.bias.zero_()
        ends.bias[end] = 5.0
    model.lm_head = ends
    scores = generation_scores(model, tokenizer, "rotten_tomatoes", 48, 8)
    assert scores["n"] == 8 and scores["end_of_sequence_first"] == 1.0
    assert scores["end_of_sequence_first_logprob"] == pytest.approx(5.0 - math.log(math.exp(5.0) + vocabulary - 1))
    assert scores["generation_is_a_verbaliser"] == 0.0 and {e["answer"] for e in scores["examples"]} == {""}
    assert scores["generation_begins_with_a_verbaliser"] == scores["generation_begins_with_gold"] == 0.0
    with torch.no_grad():
        ends.bias[end] = -5.0  # never first: every answer starts with a word (all logits but one tie at 0)
    assert generation_scores(model, tokenizer, "rotten_tomatoes", 48, 8)["end_of_sequence_first"] == 0.0
