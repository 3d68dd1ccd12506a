"""What ε covers: add/remove-one and replace-one ε from the accountants, the record's unit/relation fields
(schema 2, schema-1 records still load) and the statement quoted by the cards."""

import json
import math

import pytest
from opacus.accountants import create_accountant

from hf_dpmerge import PrivacyRecord
from hf_dpmerge.records.record import PRIVACY_RECORD_NAME, PrivacyRecordError
from hf_dpmerge.records.statement import PrivacyStatement
from hf_dpmerge.training.dp.accounting import pld_epsilon, replace_one_epsilon
from tests.utils.independent_accounting import independent_replace_one_epsilon
from tests.utils.training_helpers import make_trainer

# rotten_tomatoes' default recipe (hf_dpmerge/training/recipe.py): N = 9243 training rows, B = 256, 40 steps,
# δ = 1/(10N); σ = 0.52277 is what calibrate_noise_multiplier gives for ε = 8 there (opacus PRV, add/remove-one)
RT_N, RT_B, RT_STEPS, RT_SIGMA = 9243, 256, 40, 0.52276611328125


@pytest.fixture(scope="module")
def rotten_tomatoes_run():
    return {"effective_noise_multiplier": RT_SIGMA, "sample_rate": RT_B / RT_N, "steps": RT_STEPS,
            "delta": 1 / (10 * RT_N)}


def test_add_remove_pld_matches_opacus_prv(rotten_tomatoes_run):
    prv = create_accountant("prv")
    prv.history = [(rotten_tomatoes_run["effective_noise_multiplier"], rotten_tomatoes_run["sample_rate"], RT_STEPS)]
    want = prv.get_epsilon(delta=rotten_tomatoes_run["delta"])
    assert 7.9 < want <= 8.0
    assert pld_epsilon("add/remove-one", **rotten_tomatoes_run) == pytest.approx(want, rel=0.01)


def test_replace_one_exceeds_add_remove_and_matches_an_independent_computation(rotten_tomatoes_run):
    replace = replace_one_epsilon(**rotten_tomatoes_run)
    add_remove = pld_epsilon("add/remove-one", **rotten_tomatoes_run)
    assert replace > add_remove + 0.2  # 8.38 vs 7.99 for this recipe (README, docs/privacy.md)
    assert 8.2 < replace < 8.6
    independent = independent_replace_one_epsilon(
        rotten_tomatoes_run["effective_noise_multiplier"], RT_B / RT_N, RT_STEPS, rotten_tomatoes_run["delta"]
    )
    assert replace == pytest.approx(independent, rel=0.01)


def test_two_query_accounts_replace_one_at_sigma_over_sqrt2(tmp_path):
    trainer = make_trainer(tmp_path, sam_mode="two_query", max_steps=2, noise_multiplier=1.2, target_epsilon=None)
    trainer.train()
    want = replace_one_epsilon(effective_noise_multiplier=1.2 / math.sqrt(2), sample_rate=trainer.sample_rate,
                               steps=2, delta=trainer.delta)
    record = trainer.privacy_record()
    assert record.epsilon_replace_one == pytest.approx(want, rel=1e-9)
    one_query = replace_one_epsilon(effective_noise_multiplier=1.2, sample_rate=trainer.sample_rate, steps=2,
                                    delta=trainer.delta)
    assert record.epsilon_replace_one > one_query


def test_limits_large_sigma_and_small_q_spend_nothing_and_zero_sigma_is_not_private():
    common = {"steps": 50, "delta": 1e-5}
    assert replace_one_epsilon(effective_noise_multiplier=1e3, sample_rate=0.1, **common) < 1e-2
    assert replace_one_epsilon(effective_noise_multiplier=0.8, sample_rate=1e-7, **common) < 1e-2
    assert replace_one_epsilon(effective_noise_multiplier=0.8, sample_rate=0.0, **common) == 0.0
    assert replace_one_epsilon(effective_noise_multiplier=0.0, sample_rate=0.1, **common) == math.inf
    assert replace_one_epsilon(effective_noise_multiplier=0.8, sample_rate=0.1, steps=0, delta=1e-5) == 0.0
    # q = 1: the Gaussian mechanism at sensitivity 2, i.e. add/remove at σ/2
    full = replace_one_epsilon(effective_noise_multiplier=4.0, sample_rate=1.0, steps=1, delta=1e-5)
    assert full == pytest.approx(pld_epsilon("add/remove-one", effective_noise_multiplier=2.0, sample_rate=1.0,
                                             steps=1, delta=1e-5), rel=1e-3)
    with pytest.raises(ValueError, match="neighbouring relation"):
        pld_epsilon("replace-two", effective_noise_multiplier=1.0, sample_rate=0.1, steps=1, delta=1e-5)


def test_record_states_unit_relation_and_both_epsilons(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=2)
    trainer.train()
    trainer.save_model(str(tmp_path / "adapter"))
    data = json.loads((tmp_path / "adapter" / PRIVACY_RECORD_NAME).read_text())
    assert data["schema_version"] == 2
    assert data["privacy_unit"] == "example" and data["num_units"] == data["num_samples"] == 200
    assert data["neighbouring_relation"] == "add/remove-one"
    assert data["epsilon_replace_one"] == pytest.approx(trainer.accountant.epsilon_replace_one())
    assert data["epsilon_replace_one"] > 0


def _schema_1(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=1)
    trainer.train()
    data = trainer.privacy_record().to_dict()
    for key in ("privacy_unit", "num_units", "neighbouring_relation", "epsilon_replace_one"):
        data.pop(key)
    return {**data, "schema_version": 1}


def test_schema_1_records_load_as_example_level_add_remove_with_replace_one_unknown(tmp_path):
    (tmp_path / PRIVACY_RECORD_NAME).write_text(json.dumps(_schema_1(tmp_path)))
    record = PrivacyRecord.load(tmp_path)
    assert record.privacy_unit == "example" and record.num_units == record.num_samples
    assert record.neighbouring_relation == "add/remove-one" and record.epsilon_replace_one is None
    assert record.schema_version == 2
    assert "not computed" in PrivacyStatement.from_records({"old": record}).markdown()


def test_schema_2_record_without_unit_fields_is_refused(tmp_path):
    data = {**_schema_1(tmp_path), "schema_version": 2}
    with pytest.raises(PrivacyRecordError, match="lacks keys.*epsilon_replace_one"):
        PrivacyRecord.from_dict(data)
    with pytest.raises(PrivacyRecordError, match="privacy_unit"):
        PrivacyRecord.from_dict({**data, "privacy_unit": "author", "num_units": 10,
                                 "neighbouring_relation": "add/remove-one", "epsilon_replace_one": None})


def test_statement_says_what_epsilon_covers(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=1)
    trainer.train()
    row = trainer.privacy_record()
    unit = PrivacyRecord.from_dict({**row.to_dict(), "privacy_unit": "unit:author", "num_units": 40})
    text = PrivacyStatement.from_records({"rows": row}).markdown()
    assert "one training example (row)" in text and "replace-one" in text and "group privacy" in text
    assert f"{row.epsilon_replace_one:.3g}" in text and "privacy_unit_column" in text
    text = PrivacyStatement.from_records({"authors": unit}).markdown()
    assert "all training rows sharing one value of `author`" in text and "group privacy" not in text
