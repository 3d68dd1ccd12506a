"""Released artefacts give the same predictions through stock transformers/peft as through hf_dpmerge, or
refuse to load: the task adapter (AutoPeftModelForSequenceClassification, AutoModelForSequenceClassification,
pipeline), each task of the Hub release (``<task>/`` subfolders) and that release after a loopback-Hub push."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from peft import PeftModel

from hf_dpmerge.data.tasks import TaskSpec
from hf_dpmerge.modeling import load_sequence_classifier
from hf_dpmerge.modeling.stock_release import REMOTE_CODE_FILE, make_adapter_stock_loadable
from hf_dpmerge.modeling.task_head import attach_head, task_head_state
from hf_dpmerge.records.release_files import RELEASE_ALLOW_LIST
from hf_dpmerge.training.lora_classifier import lora_sequence_classifier
from tests.utils.hub_helpers import serving_loopback_hub, write_hub_cache
from tests.utils.stock_loading import (
    ADAPTER,
    SHARED_BASE,
    SPEC_LABELS,
    TEXTS,
    load_without_hf_dpmerge,
    release_task_adapter,
)
from tests.utils.tiny_models import tiny_bert, tiny_tokenizer

pytestmark = pytest.mark.slow  # each check loads a release in a fresh interpreter

SPEC = TaskSpec("topics", 3, SPEC_LABELS, ("text",), "accuracy", "packaged")


@pytest.fixture(scope="module")
def released_adapter(tmp_path_factory):
    """A mean-pooling shared base and a 3-label adapter trained from it, in the runs layout, released as
    train_glue releases it."""
    return release_task_adapter(tmp_path_factory.mktemp("stock"))


def hf_dpmerge_logits(root) -> torch.Tensor:
    """The adapter's logits as ``hf-dpmerge evaluate`` computes them: its individual model (shared base + adapter)."""
    from hf_dpmerge.analysis.task_models import load_individual_model

    model = load_individual_model(root / SHARED_BASE, root / ADAPTER, SPEC).eval()
    with torch.no_grad():
        return model(**tiny_tokenizer()(TEXTS, padding=True, return_tensors="pt")).logits


def assert_logits(answer: dict, root) -> None:
    assert "error" not in answer, answer
    torch.testing.assert_close(torch.tensor(answer["logits"]), hf_dpmerge_logits(root), atol=1e-5, rtol=0)
    assert answer["id2label"] == {"0": "acq", "1": "crude", "2": "earn"}


@pytest.mark.parametrize("loader", ["auto", "peft_model"])
def test_adapter_loads_by_path_from_another_directory(released_adapter, loader, tmp_path):
    """A folder holding a model and an adapter is, to transformers, a model with an embedded adapter: by path,
    from a working directory that is not the adapter's (the repository root, where the runs folder is)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    answer = load_without_hf_dpmerge(loader, released_adapter / ADAPTER, cwd=elsewhere,
                                     HF_MODULES_CACHE=str(tmp_path / "modules"))
    assert_logits(answer, released_adapter)


def test_adapter_loads_through_auto_peft_from_its_folder(released_adapter, tmp_path):
    """Stock peft opens base_model_name_or_path relative to the working directory: "." is the adapter folder."""
    answer = load_without_hf_dpmerge("peft", ".", cwd=released_adapter / ADAPTER,
                                     HF_MODULES_CACHE=str(tmp_path / "modules"))
    assert_logits(answer, released_adapter)


def test_adapter_loads_by_path_after_the_runs_folder_is_moved(released_adapter, tmp_path):
    moved = tmp_path / "moved" / "my_runs"
    shutil.copytree(released_adapter / "runs", moved)
    adapter = moved / ADAPTER.relative_to("runs")
    for loader in ("auto", "pipeline"):
        answer = load_without_hf_dpmerge(loader, adapter, cwd=tmp_path,
                                         HF_MODULES_CACHE=str(tmp_path / f"modules-{loader}"))
        if loader == "auto":
            assert_logits(answer, released_adapter)
    assert "error" not in answer, answer
    expected = torch.softmax(hf_dpmerge_logits(released_adapter), dim=-1)
    for scores, probabilities in zip(answer["pipeline"], expected):
        by_label = {item["label"]: item["score"] for item in scores}
        assert set(by_label) == set(SPEC.label_names)
        torch.testing.assert_close(torch.tensor([by_label[n] for n in SPEC.label_names]), probabilities,
                                   atol=1e-5, rtol=0)


def test_adapter_without_remote_code_is_refused_not_misread(released_adapter, tmp_path):
    answer = load_without_hf_dpmerge("no_remote_code", released_adapter / ADAPTER, cwd=tmp_path,
                                     HF_MODULES_CACHE=str(tmp_path))
    assert "trust_remote_code" in answer.get("error", ""), answer


def test_adapter_folder_is_its_own_base_named_relative_to_itself(released_adapter):
    adapter = released_adapter / ADAPTER
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "."  # no path of the training machine (it would not exist
    # where the adapter is downloaded)
    assert (adapter / REMOTE_CODE_FILE).is_file() and REMOTE_CODE_FILE in RELEASE_ALLOW_LIST
    assert not (adapter / "base").exists()
    model_config = json.loads((adapter / "config.json").read_text())
    assert model_config["auto_map"]["AutoModelForSequenceClassification"].startswith("modeling_mean_pooling_bert.")
    assert "hf_dpmerge" not in (adapter / REMOTE_CODE_FILE).read_text().split('"""', 2)[2]


def test_adapter_takes_the_encoder_from_the_runs_shared_base(released_adapter, tmp_path):
    """The adapter folder holds the task's config and head only; the encoder is read from <runs>/base/ (a
    relative path, once for every task). A copy of the adapter folder alone is refused by name; without the
    pointer (a base outside a runs layout) the base is written whole and loads the same."""
    from safetensors.torch import load_file

    adapter = released_adapter / ADAPTER
    assert sorted(p.name for p in adapter.glob("*.safetensors")) == ["adapter_model.safetensors", "head.safetensors"]
    assert json.loads((adapter / "config.json").read_text())["shared_encoder_weights"] == \
        "../../base/model.safetensors"
    head, saved = load_file(adapter / "head.safetensors"), task_head_state(adapter)
    assert sorted(head) == sorted(saved) and all(torch.equal(head[k], saved[k]) for k in head)

    alone = tmp_path / "alone" / "adapter"
    shutil.copytree(adapter, alone)
    answer = load_without_hf_dpmerge("auto", alone, cwd=tmp_path, HF_MODULES_CACHE=str(tmp_path / "m1"))
    assert "shared_encoder_weights" in answer.get("error", "") and "base/model.safetensors" in answer["error"], answer

    elsewhere = tmp_path / "elsewhere" / "adapter"
    shutil.copytree(adapter, elsewhere)
    make_adapter_stock_loadable(elsewhere, released_adapter / SHARED_BASE, SPEC.label_names)
    assert (elsewhere / "model.safetensors").is_file() and not (elsewhere / "head.safetensors").exists()
    answer = load_without_hf_dpmerge("auto", elsewhere, cwd=tmp_path, HF_MODULES_CACHE=str(tmp_path / "m2"))
    assert_logits(answer, released_adapter)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_a_pushed_adapter_names_its_base_by_hub_id_and_loads_from_the_hub_cache(loopback_hub, tmp_path, pooling):
    """DPSAMTrainer.push_to_hub of an adapter whose base has no Hub id: the base goes up alongside (the
    repository is its own stock base; mean pooling through the remote code) and adapter_config.json names the
    repository; by repo id from a Hub cache, stock peft, transformers and pipeline compute the trained model's
    logits."""
    from tests.utils.training_helpers import lora_classifier, make_trainer

    if pooling == "mean":
        tiny_bert().save_pretrained(tmp_path / "plain")
        load_sequence_classifier(tmp_path / "plain", classifier_pooling="mean").save_pretrained(tmp_path / "base")
        model = lora_sequence_classifier(tmp_path / "base", SPEC, r=4, alpha=8, target_modules=["query", "value"])
    else:
        model = lora_classifier()
    trainer = make_trainer(tmp_path / "run", model=model, max_steps=1, hub_model_id="alice/topics-adapter")
    trainer.train()
    trainer.processing_class = tiny_tokenizer()  # pushed beside the model, as Trainer saves it
    trainer.push_to_hub(allow_seeded=True)
    files = loopback_hub.repos["alice/topics-adapter"].files
    assert json.loads(files["adapter_config.json"])["base_model_name_or_path"] == "alice/topics-adapter"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    assert (REMOTE_CODE_FILE in files) == (pooling == "mean")
    write_hub_cache(tmp_path / "hub", "alice/topics-adapter", files)
    model = trainer.model.eval()
    with torch.no_grad():
        expected = model(**tiny_tokenizer()(TEXTS, padding=True, return_tensors="pt").to(model.device)).logits.cpu()
    for loader in ("peft", "auto", "pipeline"):
        answer = load_without_hf_dpmerge(loader, "alice/topics-adapter", cwd=tmp_path,
                                         HF_HUB_CACHE=str(tmp_path / "hub"),
                                         HF_MODULES_CACHE=str(tmp_path / f"modules-{loader}"))
        assert "error" not in answer, (loader, answer)
        if loader == "pipeline":
            scores = [{item["label"]: item["score"] for item in row} for row in answer["pipeline"]]
            labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
            probabilities = torch.tensor([[row[label] for label in labels] for row in scores])
            torch.testing.assert_close(probabilities, torch.softmax(expected, -1), atol=1e-5, rtol=0)
        else:
            torch.testing.assert_close(torch.tensor(answer["logits"]), expected, atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def hub_release(released_adapter, tmp_path_factory, make_record):
    """A merged folder as mergekit writes it (shared base + the adapter's LoRA), pushed to a loopback Hub;
    the files the Hub received, written back to disk as a download would."""

    from hf_dpmerge.hub.push import push_merged_model

    root = released_adapter
    make_record("topics", extra={"label_names": list(SPEC.label_names)}).save(root / ADAPTER)
    base = load_sequence_classifier(root / SHARED_BASE, num_labels=3, ignore_mismatched_sizes=True)
    merged = PeftModel.from_pretrained(base, root / ADAPTER).merge_and_unload()
    merged.save_pretrained(root / "merged")
    tiny_tokenizer().save_pretrained(root / "merged")
    (root / "merged" / "mergekit_config.yml").write_text("merge_method: dp_aware\n")
    with serving_loopback_hub() as hub:
        push_merged_model(root / "merged", "alice/m", adapters={"topics": root / ADAPTER}, token=hub.token,
                          endpoint=hub.url)
        files = hub.repos["alice/m"].files
    download = tmp_path_factory.mktemp("download")
    for name, content in files.items():
        (download / name).parent.mkdir(parents=True, exist_ok=True)
        (download / name).write_bytes(content)
    return download


def merged_task_logits(root) -> torch.Tensor:
    """The merged model's logits for the task as hf-dpmerge evaluate computes them: merged encoder + head."""
    model = load_sequence_classifier(root / "merged", num_labels=3, ignore_mismatched_sizes=True).eval()
    attach_head(model, task_head_state(root / ADAPTER))
    with torch.no_grad():
        return model(**tiny_tokenizer()(TEXTS, padding=True, return_tensors="pt")).logits


def test_hub_release_task_subfolder_gives_hf_dpmerge_logits(released_adapter, hub_release, tmp_path):
    answer = load_without_hf_dpmerge("auto", hub_release, "topics", HF_MODULES_CACHE=str(tmp_path))
    assert "error" not in answer, answer
    torch.testing.assert_close(torch.tensor(answer["logits"]), merged_task_logits(released_adapter),
                               atol=1e-5, rtol=0)
    assert answer["id2label"] == {"0": "acq", "1": "crude", "2": "earn"}
    classify = load_without_hf_dpmerge("pipeline", hub_release, "topics", HF_MODULES_CACHE=str(tmp_path))
    assert "error" not in classify, classify
    expected = torch.softmax(merged_task_logits(released_adapter), dim=-1)
    for scores, probabilities in zip(classify["pipeline"], expected):
        by_label = {item["label"]: item["score"] for item in scores}
        torch.testing.assert_close(torch.tensor([by_label[n] for n in SPEC.label_names]), probabilities,
                                   atol=1e-5, rtol=0)


def test_hub_release_stages_the_encoder_once_and_each_task_its_head(released_adapter, hub_release):
    from safetensors.torch import load_file

    files = sorted(p.relative_to(hub_release).as_posix() for p in hub_release.rglob("*") if p.is_file())
    assert [f for f in files if f.endswith(".safetensors")] == ["model.safetensors", "topics/head.safetensors"]
    encoder = load_file(hub_release / "model.safetensors")
    assert not [k for k in encoder if k.startswith("classifier.")]  # the root has no meaningless head
    merged = load_file(released_adapter / "merged" / "model.safetensors")
    assert all(torch.equal(encoder[k], merged[k]) for k in encoder) and len(encoder) == len(merged) - 2
    head = load_file(hub_release / "topics" / "head.safetensors")
    saved = task_head_state(released_adapter / ADAPTER)
    assert sorted(head) == ["classifier.bias", "classifier.weight"]
    assert all(torch.equal(head[k], saved[k]) for k in head)
    config = json.loads((hub_release / "topics" / "config.json").read_text())
    assert config["shared_encoder_weights"] == "../model.safetensors"


def test_hub_release_task_folder_loads_on_its_own_path(released_adapter, hub_release, tmp_path):
    """``pipeline(model="<release>/<task>")``: the folder's own path, its encoder one level up."""
    answer = load_without_hf_dpmerge("auto", hub_release / "topics", HF_MODULES_CACHE=str(tmp_path))
    assert "error" not in answer, answer
    torch.testing.assert_close(torch.tensor(answer["logits"]), merged_task_logits(released_adapter),
                               atol=1e-5, rtol=0)


def test_hub_release_task_subfolder_loads_from_the_hub_cache(released_adapter, hub_release, tmp_path):
    """By repository id, as after a download from the Hub: the files in the Hub cache's layout
    (``models--<owner>--<name>/snapshots/<commit>``), read offline through huggingface_hub."""
    cache = tmp_path / "hub"
    write_hub_cache(cache, "alice/m", {p.relative_to(hub_release).as_posix(): p.read_bytes()
                                       for p in hub_release.rglob("*") if p.is_file()})
    answer = load_without_hf_dpmerge("auto", "alice/m", "topics", HF_MODULES_CACHE=str(tmp_path / "modules"),
                                     HF_HUB_CACHE=str(cache))
    assert "error" not in answer, answer
    torch.testing.assert_close(torch.tensor(answer["logits"]), merged_task_logits(released_adapter),
                               atol=1e-5, rtol=0)


def test_hub_release_task_model_saves_as_a_complete_model(released_adapter, hub_release, tmp_path):
    """Loaded through the remote code, a task model saves all its weights: the copy no longer names the shared
    file and loads like any checkpoint."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(hub_release, subfolder="topics", trust_remote_code=True)
    model.save_pretrained(tmp_path / "copy")
    assert not json.loads((tmp_path / "copy" / "config.json").read_text()).get("shared_encoder_weights")
    again = AutoModelForSequenceClassification.from_pretrained(tmp_path / "copy", trust_remote_code=True).eval()
    with torch.no_grad():
        logits = again(**tiny_tokenizer()(TEXTS, padding=True, return_tensors="pt")).logits
    torch.testing.assert_close(logits, merged_task_logits(released_adapter), atol=1e-5, rtol=0)


def test_hub_release_root_is_refused_not_misread(hub_release, tmp_path):
    answer = load_without_hf_dpmerge("auto", hub_release, HF_MODULES_CACHE=str(tmp_path))
    assert "config.json" in answer.get("error", ""), answer


def test_push_and_the_merges_task_folders_name_a_heads_labels_by_one_rule(tmp_path):
    """The record's names when they fit the head, then its id2label, then the caller's fallback (the task's), else
    LABEL_i — for hf-dpmerge push's card and staged folders as for hf-dpmerge merge's task folders."""
    from hf_dpmerge.hub.staging import extract_head
    from hf_dpmerge.modeling.stock_release import release_label_names
    from hf_dpmerge.records.record import PrivacyRecord
    from hf_dpmerge.scripts.task_folders import label_names
    from tests.utils.merging_builders import save_task_adapter

    adapter = save_task_adapter(tmp_path, "bbc_news", 3, seed=1).parent / "adapter"
    record = PrivacyRecord.load(adapter)
    assert release_label_names(adapter, {"label_names": ["a", "b", "c"]}) == ["a", "b", "c"]
    assert release_label_names(adapter, {"label_names": ["a", "b"], "id2label": {"1": "y", "0": "x", "2": "z"}}) \
        == ["x", "y", "z"]  # names that do not fit the head are passed over
    assert release_label_names(adapter, {}, ["p", "q", "r"]) == ["p", "q", "r"]
    assert release_label_names(adapter, {}) == ["LABEL_0", "LABEL_1", "LABEL_2"]
    record.extra["label_names"] = ["n1", "n2", "n3"]
    record.save(adapter)
    record = PrivacyRecord.load(adapter)
    assert extract_head("bbc_news", adapter, record)[1].label_names == label_names("bbc_news", adapter, record) \
        == ["n1", "n2", "n3"]
