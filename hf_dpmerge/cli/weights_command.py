"""Write a score-weighted copy of a mergekit config: each model's weight = softmax(score / temperature).

Example::

    hf-dpmerge weights merge_configs/task_arithmetic.yaml weighted.yaml --scores 0.9,0.2,0.5,0.7 --temperature 0.1
    hf-dpmerge merge weighted.yaml merged --lora-merge-cache runs/lora_cache

One score per entry of the config's ``models:`` list, in its order. The scores are published in the
written file's header: use public scores (scores measured on private data leak it; ``hf-dpmerge tune``
selects weights privately).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("config", help="mergekit YAML configuration whose models get the weights")
    parser.add_argument("output", help="where the weighted configuration is written (refused if it exists)")
    parser.add_argument("--scores", required=True, help="comma-separated scores, one per model in 'models:' order")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="softmax temperature T > 0 (default 1; small T: the top score takes most weight)")


def _parse_scores(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--scores must be comma-separated numbers, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    from hf_dpmerge.merging.config_edit import read_merge_config, write_merge_config
    from hf_dpmerge.merging.planning.score_weights import score_weighted_config

    output = Path(args.output)
    if output.exists():
        raise FileExistsError(f"{output} exists; choose another output path")
    scores = _parse_scores(args.scores)
    config = score_weighted_config(read_merge_config(args.config), scores, args.temperature)
    header = (f"Score-weighted from {args.config} by hf-dpmerge weights: "
              f"weight = softmax(score / {args.temperature:g})\n"
              f"scores: {', '.join(f'{s:g}' for s in scores)}")
    write_merge_config(output, config, header)
    for model, score in zip(config["models"], scores, strict=True):
        print(f"{score:>10g}  weight {model['parameters']['weight']:.4f}  {model['model']}")
    print(f"wrote {output}")
    return 0
