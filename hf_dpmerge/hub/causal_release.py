"""Release a merged causal LM: the merged model at the repository root, each task's privacy record, a card.

    README.md                         the card: privacy statement, merge recipe, evaluation, prompt format
    config.json, model.safetensors, generation_config.json, tokenizer files, mergekit_config.yml
                                      the merged directory's files (mergekit's README replaced)
    <task>/dp_privacy.json            each merged adapter's privacy record, byte for byte

Unlike a merged classifier there is no task head: the merged LM is the whole model, loaded by
``AutoModelForCausalLM`` / ``pipeline("text-generation")`` at the root, and every task is asked in its
instruction format (:mod:`hf_dpmerge.data.instructions`). The card's ``base_model_relation`` is ``merge``
(the adapters' deltas merged into the base's weights). Only allow-listed files are released.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from huggingface_hub import ModelCard, ModelCardData

from hf_dpmerge.hub.model_card import CARD_TAGS, MergeRecipe, _common, _fingerprint_text, hub_model_id
from hf_dpmerge.hub.push import PushError, PushResult, _load_record, _place, release_staged
from hf_dpmerge.records.record import CAUSAL_LM, PRIVACY_RECORD_NAME, PrivacyRecord
from hf_dpmerge.records.release_files import unlisted_files
from hf_dpmerge.records.statement import check_unseeded_release, privacy_statement, public_eval_note, seeded_warning

PIPELINE_TAG = "text-generation"


def is_causal_release(records: Mapping[str, PrivacyRecord]) -> bool:
    """Whether the adapters are causal-LM adapters (all of them); a mixture is refused."""
    kinds = {record.extra.get("model_kind") == CAUSAL_LM for record in records.values()}
    if len(kinds) > 1:
        raise PushError("the adapters mix causal-LM and sequence-classification runs: release them separately")
    return kinds == {True}


def _evaluation_section(evaluation: Mapping | None) -> str:
    if not evaluation:
        return "No evaluation results were given.\n"
    split, subset = evaluation.get("split", "test"), evaluation.get("max_eval_samples")
    lines = [
        f"As written by `hf-dpmerge evaluate` on each task's {split} split"
        + (f" (a stratified subset of {subset} examples per task)" if subset else "")
        + ": the label is the verbaliser with the highest log-likelihood after the prompt; floor is the base model "
        "zero-shot, individual the task's own adapter, merged this model; retention = merged / individual, "
        "gain retained = (merged − floor) / (individual − floor).\n",
        "| task | metric | ε | floor | individual | merged | retention | gain retained | examples |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(value) -> str:
        return "–" if value is None else f"{value:.1%}"

    for task, row in evaluation["tasks"].items():
        epsilon = "∞" if math.isinf(row["epsilon"]) else f"{row['epsilon']:.3g}"
        lines.append(f"| {task} | {row['metric']} | {epsilon} | {row['floor']:.4f} | {row['individual']:.4f} | "
                     f"{row['merged']:.4f} | {cell(row['retention'])} | {cell(row['gain_retained'])} | "
                     f"{row['num_examples']} |")
    return "\n".join(lines) + "\n"


def causal_model_card(records: Mapping[str, PrivacyRecord], *, repo_id: str, merge: MergeRecipe,
                      evaluation: Mapping | None = None, base_model: str | None = None,
                      license: str = "apache-2.0", local_roots=()) -> ModelCard:
    """The card of a merged causal LM built from the causal-LM adapters whose privacy ``records`` are given."""
    hub_base = hub_model_id(base_model or _common([r.extra.get("base_model_hub_id") for r in records.values()]),
                            local_roots)
    data = ModelCardData(license=license, base_model=hub_base, base_model_relation="merge" if hub_base else None,
                         pipeline_tag=PIPELINE_TAG, tags=[*CARD_TAGS, "causal-lm"], library_name="transformers")
    tasks = ", ".join(f"`{task}`" for task in records)
    all_private = all(r.dp and math.isfinite(r.epsilon) for r in records.values())
    kind = "differentially private (DP-SGD) LoRA adapters" if all_private else "LoRA adapters"
    notes = "".join(f"\n{note}\n" for note in (seeded_warning(records), public_eval_note(records)) if note)
    fingerprint = _fingerprint_text(records)
    verbalisers = "\n".join(f"- `{task}`: {', '.join(r.extra.get('verbalisers') or [])}"
                            for task, r in records.items())
    merge_text = (f"Method: `{merge.method or 'unknown'}`. The configuration `{merge.source}`, verbatim:\n\n"
                  f"```yaml\n{merge.text.rstrip()}\n```\n" if merge.text else
                  "No merge configuration was found next to the merged model.\n")
    body = f"""---
{data.to_yaml()}
---

# {repo_id.split("/")[-1]}

This causal language model merges {len(records)} {kind}{f" on top of `{hub_base}`" if hub_base else ""}{
    f" with mergekit's `{merge.method}` method" if merge.method else ""}, one per task: {tasks}. Each task was
trained as an instruction (the task's question about the text; the answer is the label's verbaliser) with
`hf_dpmerge`; the loss covered the answer tokens only. Each task's privacy record is `<task>/dp_privacy.json`.

## Privacy

Per task, as recorded at training time in `dp_privacy.json` (ε, δ, the accountant that computed them, and N, the
number of training examples):

{privacy_statement(records)}
{notes}{f"{chr(10)}{fingerprint}{chr(10)}" if fingerprint else ""}
**Not covered by the guarantee.** The guarantee covers the released weights. It does not cover anything else
computed on private data: the evaluation numbers below, training diagnostics and any hyper-parameter selection
done on private data each release information outside (ε, δ).

## Merge

{merge_text}
## Evaluation

{_evaluation_section(evaluation)}
## Usage

The labels each task answers with:

{verbalisers}

```python
from transformers import pipeline

generate = pipeline("text-generation", model="{repo_id}")
```
"""
    return ModelCard(body)


def _stage(folder: Path, merged_dir: Path, adapters: Mapping[str, Path], card_text: str) -> None:
    for source in sorted(merged_dir.iterdir()):
        if source.is_file() and source.name != "README.md" and not source.name.startswith("."):
            _place(source, folder / source.name)
    for task, adapter in adapters.items():
        (folder / task).mkdir()
        shutil.copyfile(adapter / PRIVACY_RECORD_NAME, folder / task / PRIVACY_RECORD_NAME)
    (folder / "README.md").write_text(card_text, encoding="utf-8")
    if unlisted := [rel for rel in unlisted_files(folder) if not PurePosixPath(rel).name.startswith(".")]:
        raise PushError(f"the staged release holds files outside the release allow-list: {', '.join(unlisted)}")


def push_merged_causal_lm(
    merged_dir: str | os.PathLike,
    repo_id: str,
    *,
    adapters: Mapping[str, str | os.PathLike],
    evaluation: Mapping | None = None,
    private: bool = True,
    dry_run: bool = False,
    token: str | None = None,
    commit_message: str,
    staging_dir: str | os.PathLike | None = None,
    merge_config: str | os.PathLike | None = None,
    base_model: str | None = None,
    license: str = "apache-2.0",
    endpoint: str | None = None,
    allow_seeded: bool = False,
) -> PushResult:
    """Stage the merged causal LM + each task's privacy record + the card, then upload (or, ``dry_run``, keep the
    folder). ``evaluation`` is the causal ``results.json`` of ``hf-dpmerge evaluate`` (``model_kind: causal_lm``).
    Seeded adapters are refused unless ``allow_seeded`` (the card then warns)."""
    from huggingface_hub.utils import validate_repo_id

    validate_repo_id(repo_id)
    merged_dir = Path(merged_dir)
    if not (merged_dir / "config.json").is_file():
        raise FileNotFoundError(f"merged model directory {merged_dir} has no config.json (run mergekit-yaml first)")
    if evaluation is not None and evaluation.get("model_kind") != CAUSAL_LM:
        raise PushError("--eval_json holds a classifier evaluation: give the causal-LM runs' results.json")
    adapter_dirs = {str(task): Path(path) for task, path in adapters.items()}
    records = {task: _load_record(task, path) for task, path in adapter_dirs.items()}
    check_unseeded_release(records, allow_seeded, "--allow-seeded")
    card = causal_model_card(
        records, repo_id=repo_id, merge=MergeRecipe.load(merged_dir, merge_config), evaluation=evaluation,
        base_model=base_model, license=license,
        local_roots=[merged_dir.resolve().parent, *(p.resolve().parent.parent.parent for p in adapter_dirs.values())],
    )
    card_text = str(card)
    return release_staged(
        lambda folder: _stage(folder, merged_dir, adapter_dirs, card_text), merged_dir, repo_id, private=private,
        dry_run=dry_run, token=token, commit_message=commit_message, staging_dir=staging_dir, endpoint=endpoint,
    )
