"""Export the shared-encoder part of a task adapter, the input mergekit merges as ``base+encoder_adapter``.

Task heads (peft ``modules_to_save``) differ in shape across tasks and are never merged (docs/design.md §8),
and peft cannot apply an adapter whose saved head does not match the base's. The export keeps only the
LoRA weights, clears ``modules_to_save`` and ``task_type`` (a sequence-classification adapter without
them would make peft re-add the head), and copies the privacy record and, when present, the noise statistics
(``dp_noise_stats.safetensors``). It is written to a temporary directory beside ``out_dir`` and renamed into
place.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import save_file

from hf_dpmerge.modeling.task_head import in_modules
from hf_dpmerge.records.noise_record import NOISE_STATS_NAME
from hf_dpmerge.records.record import PrivacyRecord
from hf_dpmerge.utils.adapter_files import ADAPTER_CONFIG_NAME, ADAPTER_SAFETENSORS_NAME, read_adapter_weights
from hf_dpmerge.utils.io import staged_directory


def export_encoder_adapter(adapter_dir: str | Path, out_dir: str | Path) -> Path:
    """Write ``out_dir`` with ``adapter_dir``'s LoRA weights only, its config sans heads, and its record."""
    adapter_dir, out_dir = Path(adapter_dir), Path(out_dir)
    for name in (ADAPTER_CONFIG_NAME, ADAPTER_SAFETENSORS_NAME):
        if not (adapter_dir / name).exists():
            raise FileNotFoundError(f"{adapter_dir}: no {name}; is it a saved peft adapter?")
    record = PrivacyRecord.load(adapter_dir)
    config = json.loads((adapter_dir / ADAPTER_CONFIG_NAME).read_text())
    heads = list(config.get("modules_to_save") or [])
    weights = {k: v for k, v in read_adapter_weights(adapter_dir).items() if not in_modules(k, heads)}
    if not weights:
        raise ValueError(f"{adapter_dir}: the adapter has no LoRA weights outside its task head")
    config.update(modules_to_save=None, task_type=None)

    with staged_directory(out_dir) as staged:
        staged.mkdir()
        save_file(weights, staged / ADAPTER_SAFETENSORS_NAME, metadata={"format": "pt"})
        (staged / ADAPTER_CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        if (adapter_dir / NOISE_STATS_NAME).exists():  # the dp_aware noise model's statistics
            shutil.copy2(adapter_dir / NOISE_STATS_NAME, staged / NOISE_STATS_NAME)
        record.save(staged)
    return out_dir
