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
TEXTS = ["the film was a delight from start to finish", "a dull and lifeless script", "oil prices fell"]

_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.modules["hf_dpmerge"] = None  # `import hf_dpmerge` raises ImportError from here on
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline
    from peft import AutoPeftModelForSequenceClassification

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
    """Run ``loader`` ('peft', 'auto', 'pipeline' or 'no_remote_code') on ``path`` in a fresh interpreter with
    ``hf_dpmerge`` blocked, in ``cwd`` (a task adapter names its base relative to its folder: load ``"."`` from
    there); its JSON answer (``error`` when loading raised)."""
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **env}
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, loader, str(path), subfolder, json.dumps(texts)],
        env=environment, capture_output=True, text=True, timeout=300, cwd=cwd,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers = [line.split(_MARK, 1)[1] for line in done.stdout.splitlines() if _MARK in line]
    assert answers, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(answers[-1])
