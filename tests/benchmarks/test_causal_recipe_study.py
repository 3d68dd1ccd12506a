"""The causal recipe search: candidates parse as the causal script runs them, the choice reads the select task's
validation split only, and the report scores the chosen recipe against zero-shot on test."""

import argparse

import pytest

from benchmarks import harness
from benchmarks.studies import causal_recipe
from hf_dpmerge.scripts.train import parse_arguments
from hf_dpmerge.scripts.train_causal_lm import CAUSAL_DP_DEFAULTS, SCRIPT, CausalScriptArguments


def parsed(candidate: str, split: str = "validation", epsilon: float = 8.0):
    unit = causal_recipe.causal_unit("bbc_news", candidate, split, epsilon, 0)
    argv = [*unit.settings["flags"], "--task", "bbc_news", "--eval_split", split, "--seed", "0"]
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
    """A training or zero-shot unit as the report reads it (settings and result in one dict)."""
    return {"task": task, "candidate": candidate, "split": split, "epsilon": epsilon, "seed": seed, "score": score,
            "seconds": 600.0, "noise_multiplier": 1.0, "sample_rate": 0.1, "answer_end_scored": True}


def report(units, generation=()):
    return causal_recipe.causal_report(units, list(generation))


def test_the_choice_waits_for_every_candidate_and_reads_validation_only():
    names = list(causal_recipe.CANDIDATES)
    units = [unit(c, 0.3 + 0.01 * i) for i, c in enumerate(names)]
    assert causal_recipe.chosen_candidate(units[:-1])[0] is None
    others = [unit(names[0], 0.99, split="test"), unit(names[0], 0.99, task="election_tweets"),
              unit(names[0], 0.99, epsilon=4.0), unit(causal_recipe.ZERO_SHOT, 0.99, epsilon=None)]
    chosen, scores = causal_recipe.chosen_candidate(units + others)
    assert chosen == names[-1] and scores[names[0]] == pytest.approx(0.3)


def test_the_report_gives_each_test_unit_its_gain_over_zero_shot():
    names = list(causal_recipe.CANDIDATES)
    units = [unit(c, 0.3 + 0.01 * i) for i, c in enumerate(names)]
    units += [unit(causal_recipe.ZERO_SHOT, 0.25, split="test", epsilon=None),
              unit(causal_recipe.ZERO_SHOT, 0.55, task="election_tweets", split="test", epsilon=None),
              unit(names[-1], 0.40, split="test"), unit(names[-1], 0.60, task="election_tweets", split="test"),
              unit(causal_recipe.ZERO_SHOT, 0.28, epsilon=None)]
    text = report(units)
    assert f"Chosen: `{names[-1]}`." in text and "Zero-shot base: 28.0." in text
    assert f"| bbc_news (select) | 8 | 0 | {names[-1]} | with the end | 25.0 | 40.0 | +15.0 |" in text
    assert f"| election_tweets | 8 | 0 | {names[-1]} | with the end | 55.0 | 60.0 | +5.0 | — |" in text
    units += [unit(names[-1], 0.55, split="test", epsilon=float("inf"))]
    text = report(units)  # DP gain 15 of the non-private 30
    assert f"| bbc_news (select) | 8 | 0 | {names[-1]} | with the end | 25.0 | 40.0 | +15.0 | 50% |" in text
    assert f"| bbc_news (select) | ∞ (non-private) | 0 | {names[-1]} | with the end | 25.0 | 55.0 | +30.0 | — |" in text
    units += [unit(f"{names[-1]}+dp_merging", 0.37, split="test")]  # its share: of its candidate's non-private gain
    text = report(units)
    assert f"| bbc_news (select) | 8 | 0 | {names[-1]}+dp_merging | with the end | 25.0 | 37.0 | +12.0 | 40% |" in text
    # scored on the verbaliser alone (trained without the answer's end): no floor scored that way here, and no
    # share of a gain measured with the end
    alone = {"answer_end_scored": False}
    units += [unit(f"{names[-1]}+no_answer_end", 0.5, split="test") | alone,
              unit(f"{names[-1]}+no_answer_end", 0.6, split="test", epsilon=float("inf")) | alone]
    text = report(units)
    assert f"| bbc_news (select) | 8 | 0 | {names[-1]}+no_answer_end | verbaliser alone | — | 50.0 | — | — |" in text


def test_the_report_treats_each_seed_as_one_adapter_against_the_gain_target():
    chosen = list(causal_recipe.CANDIDATES)[-1]
    units = [unit(causal_recipe.ZERO_SHOT, 0.25, split="test", epsilon=None),
             unit(chosen, 0.40, split="test"), unit(chosen, 0.30, split="test", seed=1),
             unit(chosen, 0.50, split="test", seed=2), unit(chosen, 0.45, split="test", epsilon=4.0),
             unit(chosen, 0.60, split="test", epsilon=float("inf")), unit(chosen, 0.60, split="test", seed=1,
                                                                         epsilon=float("inf"))]
    text = report(units)
    # gains +15, +5, +25 over the zero-shot 25: two of three seeds reach +10; ε = 4 and the non-private twin have one
    # and two seeds (the latter not private): no row
    assert f"| bbc_news | 8 | {chosen} | 0,1,2 | 40.0 30.0 50.0 | 40.0 | +15.0 (+5.0) | 2 of 3 |" in text
    assert text.count(f"| bbc_news | 8 | {chosen} |") == 1 and "| bbc_news | 4 |" not in text
    assert "| bbc_news | inf |" not in text and "| bbc_news | ∞" not in text
    alone = unit(chosen, 0.9, split="test", seed=3) | {"answer_end_scored": False}  # scored another way: left out
    assert "| 0,1,2 | 40.0 30.0 50.0 |" in report(units + [alone])


def test_the_anchor_variants_are_the_candidate_with_the_public_anchor_at_their_weight_and_nothing_else():
    chosen = "b1600_t12_lr1e-2"
    plain_script, plain = parsed(chosen)
    for variant, mu in causal_recipe.ANCHOR_GRID.items():
        script, anchored = parsed(f"{chosen}+{variant}")
        assert anchored.anchor_lambda == mu > 0 == plain.anchor_lambda
        assert {**anchored.to_dict(), "anchor_lambda": 0.0} == plain.to_dict()
        assert vars(script) == vars(plain_script)


def test_the_anchor_weight_is_chosen_on_the_select_tasks_validation_split_once_every_weight_is_stored():
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
    text = report(units + grid)
    assert "| 0 | 50.0 | 10.0 |" in text and "| 3 | 70.0 | 10.0 |" in text and "Chosen: μ = 3." in text


def plan(tmp_path, *argv):
    parser = argparse.ArgumentParser()
    causal_recipe.CausalRecipe().add_arguments(parser)
    args = parser.parse_args(list(argv))
    args.units_dir, args.work_dir = tmp_path / "units", tmp_path / "work"
    return causal_recipe.CausalRecipe().plan(args)


def test_the_anchor_stage_trains_each_weight_on_the_select_tasks_validation_split(tmp_path):
    names = list(causal_recipe.CANDIDATES)
    store = harness.Store(tmp_path / "units", causal_recipe.CausalRecipe.schema)
    with pytest.raises(ValueError, match="select stage is incomplete"):
        plan(tmp_path, "--stage", "anchor")
    for i, name in enumerate(names):
        store.save(causal_recipe.causal_unit("bbc_news", name, "validation", 8.0, 0), {"score": 0.3 + 0.01 * i})
    assert [(u.settings["task"], u.settings["candidate"], u.settings["split"], u.settings["epsilon"])
            for u in plan(tmp_path, "--stage", "anchor")] == [
        ("bbc_news", f"{names[-1]}+{variant}", "validation", 8.0) for variant in causal_recipe.ANCHOR_GRID]
    reported = plan(tmp_path, "--stage", "report", "--tasks", "bbc_news", "--variant", "dp_merging")
    assert [u.name for u in reported] == [f"bbc_news-{names[-1]}+dp_merging-test-eps8-seed0",
                                          "bbc_news-zero_shot-test-eps0-seed0"]


def test_the_generation_stage_scores_each_kept_test_adapter(tmp_path):
    store = harness.Store(tmp_path / "units", causal_recipe.CausalRecipe.schema)
    units = [causal_recipe.causal_unit("bbc_news", "b1600_t12_lr1e-2", split, 8.0, 0)
             for split in ("test", "validation")]
    for u in units:
        store.save(u, {"score": 0.5})
        (tmp_path / "work" / "kept" / u.name).mkdir(parents=True)
    assert [(u.name, u.settings) for u in plan(tmp_path, "--stage", "generation")] == [
        (f"generation-{units[0].name}", {"stage": "generation", "unit": units[0].name, "task": "bbc_news"})]


def test_the_script_default_is_the_chosen_candidate():
    """``CAUSAL_DP_DEFAULTS`` is the recipe the stored select units chose (rerun the search, then move the default)."""
    chosen, _ = causal_recipe.chosen_candidate(causal_recipe.trained(harness.stored("causal_recipe", 1)))
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
    from benchmarks.causal import NON_PRIVATE
    from benchmarks.studies.causal_full import RECIPE

    _, dp = parse_arguments([*RECIPE, "--target_epsilon", "8"], CausalScriptArguments, CAUSAL_DP_DEFAULTS, SCRIPT)
    assert (dp.per_device_train_batch_size, dp.max_steps, dp.learning_rate) == (64, 200, 3e-3)
    assert dp.sam_mode == "dp_sat" and dp.align_lambda == 0.05 and dp.dp
    _, plain = parse_arguments([*RECIPE, *NON_PRIVATE], CausalScriptArguments, CAUSAL_DP_DEFAULTS, SCRIPT)
    assert not plain.dp and plain.sam_mode == "none" and plain.align_lambda == 0


def test_the_report_lists_each_kept_adapters_stock_generation():
    generation = {"unit": "bbc_news-b1600_t12_lr1e-2-test-eps8-seed0", "task": "bbc_news", "n": 200,
                  "generation_is_ranked_first": 0.25, "generation_is_gold": 0.2, "generation_is_a_verbaliser": 0.5,
                  "examples": [{"answer": "sports", "gold": "business"}, {"answer": "", "gold": "tech"}]}
    text = report([unit(causal_recipe.ZERO_SHOT, 0.28, epsilon=None)], [generation])
    assert "## Stock generation of each adapter alone" in text
    assert "| bbc_news-b1600_t12_lr1e-2-test-eps8-seed0 | 200 | 25% | 20% | 50% | 'sports', '' |" in text


@pytest.mark.parametrize(("answer", "leading"), [
    ("crude oil", 1), ("crude oil.", 1), ("crude oil prices", 1), ("crude", 0), ("crude, then", 0),
    ("crudeness", None), ("", None), ("grain", 2), ("Grain", None)])
def test_the_leading_verbaliser_is_the_longest_whole_word_prefix(answer, leading):
    from benchmarks.causal import leading_verbaliser

    assert leading_verbaliser(answer, ["crude", "crude oil", "grain"]) == leading


def test_generation_scores_count_an_answer_that_ends_at_once_as_empty():
    """A model whose first greedy token is always the end of sequence answers with empty strings; the stored share
    and mean log-probability of that token at the answer's first position say so (here: a bias on its logit)."""
    import math

    import torch

    from benchmarks.causal import generation_scores
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
