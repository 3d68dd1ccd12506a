"""The causal-LM chain on a tiny random Llama: train_causal_lm.py → mergekit-yaml (stock and our methods) →
stock loading → hf-dpmerge evaluate → hf-dpmerge push --dry-run (the last two in this process)."""

import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from opacus.accountants.utils import create_accountant

from hf_dpmerge import PrivacyRecord
from hf_dpmerge.cli.main import main as hf_dpmerge
from hf_dpmerge.data.instructions import verbaliser_choices
from hf_dpmerge.data.load import load_task
from tests.utils.subprocess_helpers import run_offline as run
from tests.utils.tiny_models import save_tiny_llama

REPO = Path(__file__).resolve().parents[2]
TASKS = ("rotten_tomatoes", "election_tweets")
TINY_TRAINING = ["--max_train_samples", "64", "--max_eval_samples", "24", "--per_device_train_batch_size", "16",
                 "--physical_batch_size", "8", "--max_steps", "3", "--lora_r", "2", "--max_length", "48",
                 "--accountant", "rdp", "--learning_rate", "5e-2", "--use_cpu", "true",
                 "--lora_layers", "top_1"]  # the default's shape on 2 layers: LoRA on the top, the bottom cached
CONFIGS = ("causal_task_arithmetic", "causal_dp", "causal_cauchy_poe")


def naive_accuracy(model, tokenizer, task: str, samples: int, max_length: int, split: str = "test",
                   answer_end: bool = True) -> float:
    """One (example, label) sequence at a time, unpadded: the summed log-probability of the label's response."""
    splits, spec = load_task(task, max_eval_samples=samples)
    test = splits[split]
    prompts, responses = verbaliser_choices(test, spec, tokenizer, max_length, answer_end=answer_end)
    correct = 0
    for prompt, label in zip(prompts, test["label"]):
        scores = []
        for response in responses:
            ids = torch.tensor([prompt + response])
            with torch.no_grad():
                log_probs = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), dim=-1)
            targets = ids[0, len(prompt):]
            scores.append(log_probs[len(prompt) - 1:].gather(1, targets[:, None]).sum().item())
        correct += int(np.argmax(scores) == label)
    return correct / len(prompts)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("causal")
    base = save_tiny_llama(root / "tiny-llama")
    shutil.copytree(REPO / "merge_configs", root / "merge_configs")
    run([sys.executable, str(REPO / "examples" / "train_causal_lm.py"), "--tasks", ",".join(TASKS),
         "--model_name_or_path", str(base), *TINY_TRAINING], cwd=root)
    for name in CONFIGS:
        run(["mergekit-yaml", f"merge_configs/{name}.yaml", f"merged/{name}", "--lora-merge-cache",
             "runs_causal/lora-cache"], cwd=root)
        # hf-dpmerge evaluate of each merge, in this process (the command's own code; no interpreter start-up)
        assert hf_dpmerge(["evaluate", "--runs", str(root / "runs_causal"), "--merged", str(root / "merged" / name),
                           "--max_eval_samples", "24", "--output", str(root / "eval" / name)]) == 0
    return root


@pytest.mark.slow
def test_each_release_records_the_accountants_epsilon(project):
    for task in TASKS:
        record = PrivacyRecord.load(project / "runs_causal" / task / "adapter")
        accountant = create_accountant("rdp")
        for _ in range(record.steps):
            accountant.step(noise_multiplier=record.effective_noise_multiplier, sample_rate=record.sample_rate)
        assert record.steps == 3 and record.task == task and record.extra["model_kind"] == "causal_lm"
        assert record.extra["train_answer_end"] is True  # the default: the adapter learns to end its answer
        assert record.epsilon == pytest.approx(accountant.get_epsilon(delta=record.delta), rel=1e-9)
        assert 0 < record.epsilon <= 8.0 and record.sample_rate == pytest.approx(16 / record.num_samples)
        metrics = json.loads((project / "runs_causal" / task / "eval_metrics.json").read_text())
        assert 0.0 <= metrics["test"]["accuracy"] <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_merged_llm_loads_with_stock_transformers_and_scores_as_evaluate_does(project, name):
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    merged = project / "merged" / name
    results = json.loads((project / "eval" / name / "results.json").read_text())
    assert results["model_kind"] == "causal_lm" and set(results["tasks"]) == set(TASKS)

    model = AutoModelForCausalLM.from_pretrained(merged).eval()
    base = AutoModelForCausalLM.from_pretrained(project / "runs_causal" / "base")
    changed = {n for n, p in model.state_dict().items() if not torch.equal(p, base.state_dict()[n])}
    assert changed and all(".q_proj." in n or ".v_proj." in n for n in changed)  # LoRA targets only
    tokenizer = AutoTokenizer.from_pretrained(merged)
    for task, row in results["tasks"].items():
        assert row["merged"] == pytest.approx(naive_accuracy(model, tokenizer, task, 24, 48), abs=1e-12)
        if row["individual"] > row["floor"]:
            gain = (row["merged"] - row["floor"]) / (row["individual"] - row["floor"])
            assert row["gain_retained"] == pytest.approx(gain)
        else:  # the adapter does not beat the zero-shot floor: no share of a gain to report
            assert row["gain_retained"] is None
    generate = pipeline("text-generation", model=str(merged))
    text = generate("review : the film was a delight", max_new_tokens=2, do_sample=False)[0]["generated_text"]
    assert text.startswith("review : the film was a delight")


@pytest.mark.slow
def test_individual_and_floor_scores_are_the_adapter_and_the_base(project):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    results = json.loads((project / "eval" / "causal_task_arithmetic" / "results.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(project / "runs_causal" / "base")
    floor_model = AutoModelForCausalLM.from_pretrained(project / "runs_causal" / "base").eval()
    for task in TASKS:
        base = AutoModelForCausalLM.from_pretrained(project / "runs_causal" / "base")
        adapter = PeftModel.from_pretrained(base, project / "runs_causal" / task / "adapter").eval()
        row = results["tasks"][task]
        assert row["individual"] == pytest.approx(naive_accuracy(adapter, tokenizer, task, 24, 48), abs=1e-12)
        assert row["floor"] == pytest.approx(naive_accuracy(floor_model, tokenizer, task, 24, 48), abs=1e-12)
        assert not math.isnan(row["floor"])


@pytest.mark.slow
def test_eval_split_validation_scores_the_validation_split_instead_of_test(project, tmp_path):
    """Choosing a recipe reads validation: ``--eval_split validation`` writes that split's score, as stock peft
    scores the released adapter on it, and no test score."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_dpmerge.scripts.train_causal_lm import main as train_causal_lm

    runs = tmp_path / "runs"
    train_causal_lm(["--task", "election_tweets", "--model_name_or_path", str(project / "tiny-llama"),
                     "--runs_dir", str(runs), "--eval_split", "validation", *TINY_TRAINING])
    metrics = json.loads((runs / "election_tweets" / "eval_metrics.json").read_text())
    assert set(metrics) & {"test", "validation"} == {"validation"}
    tokenizer = AutoTokenizer.from_pretrained(runs / "base")
    adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(runs / "base"),
                                        runs / "election_tweets" / "adapter").eval()
    expected = naive_accuracy(adapter, tokenizer, "election_tweets", 24, 48, split="validation")
    assert metrics["validation"]["accuracy"] == pytest.approx(expected, abs=1e-12)


@pytest.mark.slow
def test_an_adapter_that_never_learnt_the_answers_end_is_scored_without_it(project, tmp_path):
    """``--train_answer_end false``: the script's score and every model of ``hf-dpmerge evaluate`` (floor,
    adapter, merged) sum the verbaliser's tokens alone, the end of sequence it never learnt left out."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_dpmerge.scripts.train_causal_lm import main as train_causal_lm

    runs = tmp_path / "runs"
    train_causal_lm(["--task", "election_tweets", "--model_name_or_path", str(project / "tiny-llama"),
                     "--runs_dir", str(runs), "--train_answer_end", "false", *TINY_TRAINING])
    assert PrivacyRecord.load(runs / "election_tweets" / "adapter").extra["train_answer_end"] is False
    tokenizer = AutoTokenizer.from_pretrained(runs / "base")
    base = AutoModelForCausalLM.from_pretrained(runs / "base").eval()
    adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(runs / "base"),
                                        runs / "election_tweets" / "adapter").eval()
    individual = naive_accuracy(adapter, tokenizer, "election_tweets", 24, 48, answer_end=False)
    floor = naive_accuracy(base, tokenizer, "election_tweets", 24, 48, answer_end=False)
    metrics = json.loads((runs / "election_tweets" / "eval_metrics.json").read_text())
    assert metrics["test"]["accuracy"] == pytest.approx(individual, abs=1e-12)
    # a merge at λ = 0 (the base's weights: nothing changed): merged must then score as the floor, both without the end
    (tmp_path / "zero.yaml").write_text(
        f"merge_method: task_arithmetic\nbase_model: {runs / 'base'}\nmodels:\n"
        f"  - model: {runs / 'base'}+{runs / 'election_tweets' / 'adapter'}\ndtype: float32\n"
        "parameters:\n  weight: 1.0\n  lambda: 0.0\n")
    assert hf_dpmerge(["merge", str(tmp_path / "zero.yaml"), str(tmp_path / "zero"), "--lora-merge-cache",
                       str(tmp_path / "cache"), "--quiet"]) == 0
    assert hf_dpmerge(["evaluate", "--runs", str(runs), "--merged", str(tmp_path / "zero"), "--max_eval_samples", "24",
                       "--output", str(tmp_path / "eval")]) == 0
    row = json.loads((tmp_path / "eval" / "results.json").read_text())["tasks"]["election_tweets"]
    assert row["answer_end_scored"] is False
    assert row["individual"] == pytest.approx(individual, abs=1e-12)
    assert row["floor"] == pytest.approx(floor, abs=1e-12) and row["merged"] == pytest.approx(floor, abs=1e-12)


@pytest.mark.slow
def test_push_dry_run_stages_the_merged_llm_with_its_privacy_card(project, monkeypatch):
    monkeypatch.chdir(project)
    assert hf_dpmerge(["push", "merged/causal_dp", "--repo_id", "me/tiny-llm", "--runs", "runs_causal",
                       "--eval_json", "eval/causal_task_arithmetic/results.json", "--dry-run", "--staging_dir",
                       "staged", "--base_model", "HuggingFaceTB/SmolLM2-135M-Instruct"]) == 0
    staged = project / "staged"
    card = (staged / "README.md").read_text()
    metadata = yaml.safe_load(card.split("---")[1])
    assert metadata["pipeline_tag"] == "text-generation" and metadata["base_model_relation"] == "merge"
    assert metadata["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "dp_aware" in card and all(task in card for task in TASKS) and "gain retained" in card
    for task in TASKS:
        assert (staged / task / "dp_privacy.json").read_bytes() == (
            project / "runs_causal" / task / "adapter" / "dp_privacy.json").read_bytes()
    assert (staged / "model.safetensors").is_file() and (staged / "config.json").is_file()


@pytest.mark.slow
def test_tune_chooses_the_causal_merge_with_the_best_validation_accuracy_and_push_states_the_total(
        project, monkeypatch, capsys):
    """hf-dpmerge tune on causal-LM runs: every candidate scored by verbaliser likelihood on the whole validation
    splits (public sizes: no subsampling), so at a huge ε_sel the chosen λ is the one whose merge an independent
    evaluation scores best; the push card states the composed total."""
    from hf_dpmerge.analysis.causal_evaluation import evaluate_causal_runs

    monkeypatch.chdir(project)
    sizes = {task: len(load_task(task)[0]["validation"]) for task in TASKS}
    lambdas = (0.0, 1.0, 100.0)  # λ = 100 moves predictions even when 3 noisy steps barely moved the adapters
    assert hf_dpmerge(["tune", "merge_configs/causal_task_arithmetic.yaml", "tuned", "--grid",
                       "lambda=" + ",".join(map(str, lambdas)), "--epsilon", "1e6", "--runs", "runs_causal",
                       "--validation_size", ",".join(f"{t}={n}" for t, n in sizes.items()),
                       "--lora-merge-cache", "runs_causal/lora-cache"]) == 0
    record = json.loads((project / "tuned" / "dp_selection.json").read_text())
    chosen = record["candidates"][record["chosen"]]["lambda"]

    utilities = {}
    for lam in lambdas:
        config = yaml.safe_load((project / "merge_configs" / "causal_task_arithmetic.yaml").read_text())
        config["parameters"]["lambda"] = lam
        (project / f"ta_{lam}.yaml").write_text(yaml.safe_dump(config))
        assert hf_dpmerge(["merge", f"ta_{lam}.yaml", f"check_{lam}", "--lora-merge-cache", "runs_causal/lora-cache",
                           "--quiet"]) == 0
        report = evaluate_causal_runs("runs_causal", f"check_{lam}", list(TASKS), split="validation",
                                      log=lambda _: None)
        utilities[lam] = np.mean([row.merged for row in report.tasks])
    assert len(set(utilities.values())) > 1, utilities  # the grid is informative
    assert utilities[chosen] == max(utilities.values()), utilities
    assert record["total_epsilon"] == pytest.approx(max(
        PrivacyRecord.load(project / "runs_causal" / t / "adapter").epsilon for t in TASKS) + 1e6)

    assert hf_dpmerge(["push", "tuned", "--repo_id", "me/tuned-llm", "--runs", "runs_causal", "--dry-run",
                       "--staging_dir", "staged-tuned"]) == 0
    card = (project / "staged-tuned" / "README.md").read_text()
    assert "chosen on private validation data by the exponential mechanism among 3 candidates" in card
    assert "(ε = 1e+06, δ = " in card and (project / "staged-tuned" / "dp_selection.json").is_file()


@pytest.mark.slow
def test_the_merge_benchmark_scores_what_hf_dpmerge_evaluate_scores(project, tmp_path, monkeypatch):
    """The causal_merge study on this project's adapters, kept as both trainers' seed-0 units: its zero-shot,
    individual and task-arithmetic units equal ``hf-dpmerge evaluate``'s floor, individual and merged scores of
    ``mergekit-yaml``'s merge of the same packaged config on the same rows, whichever trainer name holds them."""
    from benchmarks import harness
    from benchmarks.studies.causal_merge import TRAINERS, CausalMerge, suffix

    kept = []
    for candidate, epsilon in TRAINERS.values():
        for task in TASKS:
            name = f"{task}-{candidate}-test-eps{epsilon:g}-seed0"  # the causal_recipe study's unit, its kept folder
            shutil.copytree(project / "runs_causal" / task, tmp_path / "kept" / name / task)
            kept.append({"name": name, "settings": {"stage": "train", "task": task, "candidate": candidate,
                                                    "split": "test", "epsilon": epsilon, "seed": 0}, "result": {}})
    monkeypatch.setattr(harness, "stored", lambda study, schema: kept)
    assert harness.main(CausalMerge(), [
        "--kept", str(tmp_path / "kept"), "--base", str(project / "runs_causal" / "base"), "--tasks", ",".join(TASKS),
        "--methods", "task_arithmetic", "--max-eval-samples", "24", "--work-dir", str(tmp_path / "work"),
        "--units-dir", str(tmp_path / "units"), "--out", str(tmp_path)], log=lambda _: None) == 0
    units = {u["name"]: u["result"] for u in harness.Store(tmp_path / "units", CausalMerge.schema).results()}
    assert len(units) == 1 + 2 * len(TRAINERS)
    expected = json.loads((project / "eval" / "causal_task_arithmetic" / "results.json").read_text())["tasks"]
    tail = suffix(TASKS)  # not the study's default tasks: their names carry them
    for task in TASKS:
        assert units[f"zero_shot{tail}"]["scores"][task]["accuracy"] == pytest.approx(expected[task]["floor"],
                                                                                     abs=1e-12)
        for trainer in TRAINERS:
            scores = {what: units[f"{trainer}-seed0-{what}{tail}"]["scores"][task]
                      for what in ("individual", "task_arithmetic")}
            assert scores["individual"]["accuracy"] == pytest.approx(expected[task]["individual"], abs=1e-12)
            assert scores["task_arithmetic"]["accuracy"] == pytest.approx(expected[task]["merged"], abs=1e-12)
            assert scores["task_arithmetic"]["num_examples"] == expected[task]["num_examples"]
    assert not any(str(tmp_path) in p.read_text() for p in (tmp_path / "units").glob("*.json"))  # no local path
    report = tmp_path / "benchmarks" / "reports" / "causal_merge" / f"MERGE{tail}.md"
    assert "| task_arithmetic | 0 | +0.00 | +0.00 | — | — |" in report.read_text()
