"""Every card kind (adapter, merged, tuned, federated, the merged README's section) states privacy through one
PrivacyStatement: each ε it prints is the record's or the composed value, relations are given with their own
computed numbers (never a hand-written comparative), and it states one final (ε, δ)."""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import PLDAccountant
from mergekit.common import ModelReference
from mergekit.config import MergeConfiguration
from safetensors.torch import save_file

from hf_dpmerge.hub.model_card import build_model_card
from hf_dpmerge.merging.privacy_section import HEADING, write_privacy_section
from hf_dpmerge.records.card import adapter_card, merged_adapter_card
from hf_dpmerge.records.fingerprint import adapter_fingerprint
from hf_dpmerge.records.record import PrivacyRecord
from hf_dpmerge.records.selection_record import SelectionRecord, composed_guarantee
from hf_dpmerge.records.statement import PrivacyStatement
from hf_dpmerge.records.statement_prose import number
from tests.utils.records import privacy_record

PRIVACY_DOC = Path(__file__).resolve().parents[2] / "docs" / "privacy.md"

FINAL = re.compile(r"\(ε = ([^,]+), δ = ([^)]+)\)-DP")
PROSE = re.compile(r"ε(?:_sel)? = (∞|\d[\d.e+-]*)")
SUM = re.compile(r"ε = (\S+) \+ (\S+) = (\S+?),")
COMPARATIVES = ("larger", "smaller", "greater", "tighter", "looser", "as well")

# add/remove-one ε close together and replace-one on either side of it: the audit's 7.992 vs 7.987 and 8.00 vs 7.23
ALPHA = dict(epsilon=7.992, epsilon_replace_one=8.38, delta=2.16e-5)
BETA = dict(epsilon=7.987, epsilon_replace_one=7.23, delta=1e-5)


def table_epsilons(text: str) -> dict[str, tuple[str, str]]:
    """input → (ε add/remove-one, ε replace-one) cells of the statement's table."""
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 9 and cells[0] not in ("input", "---"):
            rows[cells[0]] = (cells[1], cells[2])
    return rows


def prose(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("|"))


def check_no_comparative(text: str) -> None:
    found = [word for word in COMPARATIVES if word in text.lower()]
    assert not found, f"hand-written comparatives {found} in:\n{text}"


def check_table(text: str, records: dict[str, PrivacyRecord]) -> None:
    assert table_epsilons(text) == {
        name: (number(r.epsilon), number(r.epsilon_replace_one)) for name, r in records.items()}


def test_adapter_card_states_the_records_epsilon_under_each_relation() -> None:
    for values in (ALPHA, BETA):
        record = privacy_record("alpha", **values)
        text = str(adapter_card(record, "alpha"))
        check_table(text, {"alpha": record})
        assert FINAL.findall(text) == [(number(record.epsilon), number(record.delta))]
        assert set(PROSE.findall(prose(text))) == {number(record.epsilon), number(record.epsilon_replace_one)}
        assert (f"ε = {number(record.epsilon)} for add/remove-one" in text
                and f"ε = {number(record.epsilon_replace_one)} for replace-one" in text)
        check_no_comparative(text)


def test_merged_card_states_the_parallel_composition_once() -> None:
    records = {"alpha": privacy_record("alpha", **ALPHA), "beta": privacy_record("beta", **BETA)}
    text = str(build_model_card(records, repo_id="bob/m"))
    check_table(text, records)
    epsilon, replace, delta = 7.992, 8.38, 2.16e-5  # max over the inputs, per relation
    assert FINAL.findall(text) == [(number(epsilon), number(delta))]
    assert set(PROSE.findall(prose(text))) == {number(epsilon), number(replace)}
    check_no_comparative(text)


def _selection(records: dict[str, PrivacyRecord], composition: str, seeded: bool = False) -> SelectionRecord:
    total, delta = composed_guarantee(records, 1.0, composition)
    return SelectionRecord(
        mechanism="exponential", epsilon=1.0, sensitivity=2.8e-3, utility="task-averaged accuracy",
        relation="addition, removal or replacement", unit="validation example", composition=composition,
        candidates=[{"lambda": 0.5}, {"lambda": 1.0}], chosen=1, validation_size={"alpha": 178, "beta": 516},
        adapters={n: {"epsilon": r.epsilon, "delta": r.delta} for n, r in records.items()},
        total_epsilon=total, total_delta=delta, seeded=seeded,
    )


def check_tuned(text: str, records: dict[str, PrivacyRecord], selection: SelectionRecord) -> None:
    """One final (ε, δ): the composed total; the adapters' composition and ε_sel only as its components."""
    adapters = max(r.epsilon for r in records.values())
    assert FINAL.findall(text) == [(number(selection.total_epsilon), number(selection.total_delta))]
    stated = set(PROSE.findall(prose(text)))
    assert stated == {number(selection.total_epsilon), number(adapters), number(selection.epsilon)}
    if selection.composition == "sequential":
        assert SUM.findall(text) == [(number(adapters), number(selection.epsilon), number(selection.total_epsilon))]
    check_table(text, records)
    check_no_comparative(text)


@pytest.mark.parametrize("composition", ["sequential", "parallel"])
def test_tuned_card_states_one_final_guarantee(composition: str) -> None:
    records = {"alpha": privacy_record("alpha", **ALPHA), "beta": privacy_record("beta", **BETA)}
    selection = _selection(records, composition)
    check_tuned(str(build_model_card(records, repo_id="bob/m", selection=selection)), records, selection)


def test_merged_readme_section_is_restated_for_the_tuned_merge(tmp_path: Path) -> None:
    """mergekit's README gets the merge's section; tune replaces it with the composed total (no second claim), its
    inputs named by their runs, and refuses an input that is not an adapter the selection was made with."""
    records = {"alpha": privacy_record("alpha", **ALPHA), "beta": privacy_record("beta", **BETA)}
    for task, record in records.items():
        adapter = tmp_path / "runs" / task / "adapter"
        adapter.mkdir(parents=True)
        (adapter / "adapter_config.json").write_text("{}")
        save_file({"lora_A": torch.full((2, 2), float(len(task)))}, adapter / "adapter_model.safetensors")
        record.save(adapter)
    inputs = {t: f"{tmp_path / 'base'}+{tmp_path / 'runs' / t / 'adapter'}" for t in records}
    config = MergeConfiguration.model_validate({
        "merge_method": "task_arithmetic", "base_model": str(tmp_path / "base"), "dtype": "float32",
        "models": [{"model": model, "parameters": {"weight": 1.0}} for model in inputs.values()],
    })
    out = tmp_path / "merged"
    out.mkdir()
    (out / "README.md").write_text("---\ntags: [merge]\n---\n# merged\n\nmergekit's card.\n")
    write_privacy_section(out, config)
    text = (out / "README.md").read_text()
    assert text.startswith("---\ntags: [merge]\n---\n# merged\n\nmergekit's card.\n") and text.count(HEADING) == 1
    check_table(text, {inputs[t]: r for t, r in records.items()})
    assert FINAL.findall(text) == [(number(7.992), number(2.16e-5))]
    check_no_comparative(text)
    selection = _selection(records, "sequential")
    selection.fingerprints = {t: adapter_fingerprint(tmp_path / "runs" / t / "adapter") for t in records}
    write_privacy_section(out, config, selection)
    text = (out / "README.md").read_text()
    assert "mergekit's card." in text and text.count(HEADING) == 1
    check_tuned(text, records, selection)
    assert "Seeded selection" not in text
    write_privacy_section(out, config, _selection(records, "sequential", seeded=True))
    assert "**Seeded selection.**" in (out / "README.md").read_text()  # a seeded tune's README says so

    selection.fingerprints["beta"] = "sha256:" + "0" * 64  # selected with another beta
    with pytest.raises(ValueError, match="beta: fingerprint differs from the adapter selected with"):
        write_privacy_section(out, config, selection)
    outside = config.model_copy(update={"models": [*config.models[:1], config.models[1].model_copy(
        update={"model": ModelReference.parse(f"{tmp_path / 'base'}+{tmp_path / 'elsewhere'}")})]})
    (tmp_path / "elsewhere").mkdir()
    records["beta"].save(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="elsewhere are not runs' adapters"):
        write_privacy_section(out, outside, selection)


def test_federated_card_states_the_record_and_the_client_level() -> None:
    client = {"epsilon": 2.5, "delta": 1e-6, "rounds": 3, "noise_multiplier": 1.1, "clip_norm": 1.0,
              "sample_rate": 0.5, "num_clients": 4, "expected_clients": 2.0, "accountant": "rdp"}
    record = privacy_record("alpha", epsilon=8.0, epsilon_replace_one=7.23, extra={"federated": {
        "example_level": {"epsilon": 8.0, "delta": 1e-5, "steps_accounted": "every client sampled in every round"},
        "client_level": client}})
    text = str(adapter_card(record, "alpha (federated)"))
    assert FINAL.findall(text) == [("8", "1e-05")]
    assert set(PROSE.findall(prose(text))) == {"8", "7.23", number(client["epsilon"])}
    assert "ε = 2.5 at δ = 1e-06 over 3 rounds" in text and "every client sampled in every round" in text
    check_no_comparative(text)


def test_a_card_without_a_private_input_claims_nothing() -> None:
    records = {"alpha": privacy_record("alpha", **ALPHA), "plain": privacy_record("plain", math.inf, dp=False)}
    text = str(build_model_card(records))
    assert FINAL.findall(text) == [] and "**no** differential-privacy guarantee" in text
    assert set(PROSE.findall(prose(text))) == set()


def test_every_private_card_says_its_epsilon_is_about_the_training_set_as_split() -> None:
    """Seeded splits move many rows when one raw row comes or goes: every card derived from private records says
    its neighbours are training sets as split (adapter, merged, tuned, federated), and docs/privacy.md says so."""
    records = {"alpha": privacy_record("alpha", **ALPHA), "beta": privacy_record("beta", **BETA)}
    federated = privacy_record("alpha", extra={"federated": {"example_level": {"steps_accounted": "each client's"},
                                                             "client_level": None}})
    cards = [str(adapter_card(records["alpha"], "alpha")), str(build_model_card(records, repo_id="bob/m")),
             str(build_model_card(records, repo_id="bob/m", selection=_selection(records, "sequential"))),
             str(adapter_card(federated, "alpha (federated)"))]
    sentence = PrivacyStatement.split_scope()
    assert "training sets **as split**" in sentence and "seeded permutation" in sentence
    for text in cards:
        covers = next(p for p in text.split("\n\n") if p.startswith("**What ε covers.**"))
        assert covers.endswith(sentence)
    plain = str(build_model_card({"plain": privacy_record("plain", math.inf, dp=False)}))
    assert sentence not in plain  # no guarantee, nothing to scope
    doc = " ".join(PRIVACY_DOC.read_text().split())
    assert "**ε is about the training set as split.**" in doc
    assert "seeded permutation" in doc and "not about one row of the raw data" in doc


# private LP-FT as bbc_news ran it: a head phase of 1000 steps at ε₁ = 6, then 75 LoRA steps
# calibrated to a total of ε = 8 in one accountant; q = 1024 / 9242 in both
Q = 1024 / 9242
LP_FT_PHASES = [{"name": "head", "noise_multiplier": 2.8046875, "effective_noise_multiplier": 2.8046875,
                 "sample_rate": Q, "expected_batch_size": 1024, "steps": 1000},
                {"name": "lora", "noise_multiplier": 1.19921875, "effective_noise_multiplier": 1.19921875,
                 "sample_rate": Q, "expected_batch_size": 1024, "steps": 75}]


@functools.lru_cache
def pld_epsilon(phases: tuple[tuple[float, float, int], ...], delta: float) -> float:
    """ε of the Poisson-subsampled Gaussian phases (σ_eff, q, steps) composed by Google's dp_accounting PLD
    accountant (add/remove-one), independent of the opacus accountants the package calls."""
    accountant = PLDAccountant()
    for sigma, q, steps in phases:
        accountant.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
    return accountant.get_epsilon(delta)


def card_phases(text: str, name: str) -> list[tuple[float, float, int]]:
    """``name``'s rows of the card's phases table (input | phase | steps | σ | q | expected batch) as (σ, q, steps)."""
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines()]
    return [(float(c[3]), float(c[4]), int(c[2])) for c in rows if len(c) == 6 and c[0] == name and c[2].isdigit()]


@pytest.mark.parametrize("card", ["adapter", "merged", "merged adapter"])
def test_every_card_states_every_phase_so_a_reader_can_recompute_epsilon(card: str) -> None:
    """An LP-FT adapter's ε composes its head phase and its LoRA phase: every card lists both (steps, σ, q,
    expected batch), and ε recomputed from the card's own numbers by an independent accountant is the ε it states.

    Tolerance 0.03: opacus' PRV ε (the record's) sits 0.010 above dp_accounting's PLD on these phases; the card's
    σ and q (4 significant digits, ≤ 5e-4 relative) move the recomputed ε by < 1e-3; the stated ε has 3
    significant digits (± 0.005 at 8). The LoRA phase alone, all the old cards stated, gives 4.9: 3 below."""
    from hf_dpmerge.training.dp.accounting import history_epsilon

    delta = 1e-5
    epsilon = history_epsilon("prv", [(p["effective_noise_multiplier"], p["sample_rate"], p["steps"])
                                      for p in LP_FT_PHASES], delta)
    lp_ft = privacy_record("bbc_news", epsilon, accountant="prv", noise_multiplier=1.19921875,
                           effective_noise_multiplier=1.19921875, sample_rate=Q, steps=75, expected_batch_size=1024,
                           num_samples=9242, extra={"phases": LP_FT_PHASES})
    records = {"bbc_news": lp_ft, "beta": privacy_record("beta", **BETA)}
    text = {
        "adapter": lambda: str(adapter_card(lp_ft, "bbc_news")),
        "merged": lambda: str(build_model_card(records, repo_id="bob/m")),
        "merged adapter": lambda: str(merged_adapter_card("ties", 1.0, [("bbc_news", 1.0), ("beta", 1.0)], "abc",
                                                          records, None)),
    }[card]()
    stated = float(next(line for line in text.splitlines() if line.startswith("| bbc_news |")).split("|")[2])
    assert FINAL.findall(text)[0][0] == number(epsilon) and stated == float(number(epsilon))
    phases = card_phases(text, "bbc_news")
    assert phases == [(2.805, 0.1108, 1000), (1.199, 0.1108, 75)]
    assert "| bbc_news | head | 1000 | 2.805 | 0.1108 | 1024 |" in text  # the expected batch too
    assert pld_epsilon(tuple(phases), delta) == pytest.approx(stated, abs=0.03)
    assert pld_epsilon(tuple(phases[-1:]), delta) < stated - 2.5
    assert card_phases(text, "beta") == ([] if card == "adapter" else [(0.9, 0.02, 100)])  # one phase: the record's


def test_cards_say_when_an_own_datasets_label_set_is_outside_epsilon_and_which_splits_were_carved() -> None:
    public = privacy_record("clinic", extra={"label_names_private": False, "carved_splits": ["validation", "test"]})
    private = privacy_record("notes", extra={"label_names_private": True, "carved_splits": []})
    text = PrivacyStatement.from_records({"clinic": public, "notes": private}).markdown()
    assert "Label names read off the private rows: `notes`" in text and "`clinic`" not in text.split(
        "Label names read off")[1].split("\n")[0]
    assert "Held-out splits of `clinic`.** Its dataset had no validation or test split" in text
    assert "read off the private rows" not in PrivacyStatement.from_record("clinic", public).markdown()
