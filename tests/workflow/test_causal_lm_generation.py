"""The merged LM answers through stock ``pipeline("text-generation")``: a tiny Llama's adapter (train_causal_lm.py,
trained until it has learnt its 64 examples, which DP noise at any useful ε prevents on a 32-wide model: the
private release path is test_causal_lm_workflow.py's), merged by stock ``mergekit-yaml``, then asked each training
prompt greedily. It mostly generates the gold verbaliser, and on every prompt what it generates is the verbaliser that
``hf-dpmerge evaluate``'s scoring ranks first (the SmolLM2 figure is in docs/causal-lm.md)."""

import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from hf_dpmerge.data.instructions import verbaliser_choices
from hf_dpmerge.data.load import load_task
from hf_dpmerge.data.tasks import get_task_spec
from hf_dpmerge.modeling.verbaliser_scoring import verbaliser_predictions
from tests.utils.subprocess_helpers import run_offline as run
from tests.utils.tiny_models import save_tiny_llama

REPO = Path(__file__).resolve().parents[2]
TASK, SAMPLES, MAX_LENGTH = "rotten_tomatoes", 64, 48


@pytest.fixture(scope="module")
def merged(tmp_path_factory) -> Path:
    from hf_dpmerge.scripts.train_causal_lm import main as train

    root = tmp_path_factory.mktemp("generation")
    base = save_tiny_llama(root / "tiny-llama", initializer_range=0.5)
    train(["--task", TASK, "--model_name_or_path", str(base), "--runs_dir", str(root / "runs_causal"),
           "--max_train_samples", str(SAMPLES), "--max_eval_samples", "8", "--max_length", str(MAX_LENGTH),
           "--per_device_train_batch_size", "16", "--physical_batch_size", "16", "--max_steps", "150",
           "--learning_rate", "1e-2", "--lora_layers", "all", "--lora_target_modules",
           "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", "--dp", "false",
           "--sam_mode", "none", "--align_lambda", "0", "--use_cpu", "true", "--disable_tqdm", "true"])
    config = yaml.safe_load((REPO / "merge_configs" / "causal_task_arithmetic.yaml").read_text())
    config["models"] = [{"model": f"./runs_causal/base+./runs_causal/{TASK}/adapter"}]
    (root / "merge.yaml").write_text(yaml.safe_dump(config))
    run(["mergekit-yaml", "merge.yaml", "merged", "--lora-merge-cache", "lora-cache"], cwd=root)
    shutil.rmtree(root / "lora-cache", ignore_errors=True)
    return root / "merged"


@pytest.mark.slow
def test_stock_generation_answers_with_the_verbaliser_evaluation_ranks_first(merged):
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    tokenizer = AutoTokenizer.from_pretrained(merged)
    train = load_task(TASK, max_train_samples=SAMPLES)[0]["train"]
    spec = get_task_spec(TASK)
    prompts, responses = verbaliser_choices(train, spec, tokenizer, MAX_LENGTH)
    verbalisers = [tokenizer.decode(r, skip_special_tokens=True).strip() for r in responses]
    texts = [tokenizer.decode(p) for p in prompts]
    assert [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts] == prompts  # the same prompts

    model = AutoModelForCausalLM.from_pretrained(merged).eval()
    ranked_first = verbaliser_predictions(model, prompts, responses, pad_token_id=tokenizer.pad_token_id)
    generate = pipeline("text-generation", model=str(merged))
    outputs = generate(texts, max_new_tokens=max(map(len, responses)), do_sample=False, return_full_text=False)
    generated = [out[0]["generated_text"].strip() for out in outputs]

    gold = np.asarray(train["label"])
    assert generated == [verbalisers[k] for k in ranked_first]
    # the gold verbaliser on most prompts: a constant answer scores 0.5 on this stratified sample
    assert np.mean([g == verbalisers[y] for g, y in zip(generated, gold)]) >= 0.75
