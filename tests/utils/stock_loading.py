"""Loading released artefacts the way a Hugging Face user does, in a subprocess where hf_dpmerge cannot be
imported: only transformers, peft and the files in the release are available."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

_MARK = "@@stock-loading@@ "
SPEC_LABELS = ("acq", "crude", "earn")
SHARED_BASE, ADAPTER = Path("runs", "base"), Path("runs", "topics", "adapter")  # train_glue.py's runs layout
TEXTS = ["the film was a delight from start to finish", "a dull and lifeless script", "oil prices fell"]

_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.modules["hf_dpmerge"] = None  # `import hf_dpmerge` raises ImportError from here on
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline
    from peft import AutoPeftModelForSequenceClassification, PeftModel

    MARK = "@@stock-loading@@ "
    loader, path, subfolder, texts = sys.argv[1], sys.argv[2], sys.argv[3] or None, json.loads(sys.argv[4])
    where = {"subfolder": subfolder} if subfolder else {}
    try:
        if loader == "pipeline":
            classify = pipeline("text-classification", model=path, trust_remote_code=True, top_k=None,
                                model_kwargs=where)
            print(MARK + json.dumps({"pipeline": classify(texts)}))
            sys.exit(0)
        if loader == "no_remote_code":
            AutoModelForSequenceClassification.from_pretrained(path, **where)
            print(MARK + json.dumps({"loaded": True}))
            sys.exit(0)
        cls = AutoPeftModelForSequenceClassification if loader == "peft" else AutoModelForSequenceClassification
        model = cls.from_pretrained(path, trust_remote_code=True, **where).eval()
        if loader == "peft_model":  # the adapter applied to a base the caller loaded (here: the folder's own)
            model = PeftModel.from_pretrained(model, path, **where).eval()
        tokenizer = AutoTokenizer.from_pretrained(path, **where)
        with torch.no_grad():
            logits = model(**tokenizer(texts, padding=True, return_tensors="pt")).logits
        print(MARK + json.dumps({"logits": logits.tolist(), "id2label": model.config.id2label}))
    except Exception as err:
        print(MARK + json.dumps({"error": f"{type(err).__name__}: {err}"}))
    """
)


def load_without_hf_dpmerge(loader: str, path: str | Path, subfolder: str = "", texts: list[str] = TEXTS,
                            cwd: str | Path | None = None, **env: str) -> dict:
    """Run ``loader`` ('peft', 'auto', 'peft_model', 'pipeline' or 'no_remote_code') on ``path`` in a fresh
    interpreter with ``hf_dpmerge`` blocked, in ``cwd``; its JSON answer (``error`` when loading raised)."""
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **env}
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, loader, str(path), subfolder, json.dumps(texts)],
        env=environment, capture_output=True, text=True, timeout=300, cwd=cwd,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers = [line.split(_MARK, 1)[1] for line in done.stdout.splitlines() if _MARK in line]
    assert answers, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(answers[-1])


def release_task_adapter(root: str | Path, shared_encoder: bool = True, task: str = "topics",
                         labels: tuple[str, ...] = SPEC_LABELS, seed: int = 3) -> Path:
    """``root/runs/base`` (a mean-pooling shared base, built unless there) and a ``len(labels)``-label adapter
    trained from it in ``root/runs/<task>/adapter`` (``seed``: its weights), released as train_glue.py releases it
    (:func:`release_adapter`, then the stock base); ``shared_encoder=False``: the stock base written whole.
    Returns ``root``."""
    import torch

    from hf_dpmerge.data.tasks import TaskSpec
    from hf_dpmerge.modeling import load_sequence_classifier
    from hf_dpmerge.modeling.stock_release import make_adapter_stock_loadable
    from hf_dpmerge.records.release_files import release_adapter
    from hf_dpmerge.training.lora_classifier import lora_sequence_classifier
    from tests.utils.tiny_models import tiny_bert, tiny_tokenizer

    root = Path(root)
    spec = TaskSpec(task, len(labels), labels, ("text",), "accuracy", "packaged")
    if not (root / SHARED_BASE / "config.json").is_file():
        tiny_bert().save_pretrained(root / "plain")
        base = load_sequence_classifier(root / "plain", classifier_pooling="mean")
        base.save_pretrained(root / SHARED_BASE)
        tiny_tokenizer().save_pretrained(root / SHARED_BASE)
    model = lora_sequence_classifier(root / SHARED_BASE, spec, r=4, alpha=8, target_modules=["query", "value"])
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.normal_(0, 0.5)
    adapter = root / "runs" / task / "adapter"
    release_adapter(adapter, lambda directory: model.save_pretrained(directory))
    pointer = "../../base/model.safetensors" if shared_encoder else None  # as train_glue.py names the runs' base
    make_adapter_stock_loadable(adapter, root / SHARED_BASE, spec.label_names, pointer)
    return root
