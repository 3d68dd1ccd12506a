"""Task grouping: cosine similarity and sign conflicts of adapters' task vectors, merge groups and their configs.

Each RUN is a run folder (``runs/<task>``) or a peft adapter folder. Prints the cosine of the task vectors
τ = s·B·A (from r×r Gram matrices), their sign-conflict rate and, for DP adapters, the noise-aware cosine (the
recorded noise energy subtracted from each norm; 95 % interval). Grouping uses the noise-aware cosine (the raw
one for a pair where it is undefined): average linkage on 1 − cosine, clusters joining while their mean is
≥ --threshold. Writes ``similarity.json``, ``similarity.png`` and a mergekit config ``merge_group_<k>.yaml`` per
group of two or more; reads released adapters only (no privacy cost; docs/merging.md). Example::

    hf-dpmerge similarity runs/reuters_r8 runs/reuters_r52 runs/bbc_news runs/rotten_tomatoes --method dp_aware
    mergekit-yaml similarity/merge_group_1.yaml merged/group_1 --lora-merge-cache lora_cache
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hf_dpmerge.merging.merge_config import METHOD_PARAMETERS
from hf_dpmerge.merging.planning.merge_groups import DEFAULT_THRESHOLD
from hf_dpmerge.records.run_folders import BASE_DIR, is_peft_adapter

RESULTS_NAME = "similarity.json"
HEATMAP_NAME = "similarity.png"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run folders (runs/<task>) or peft adapter folders")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                        help="clusters join while the mean noise-aware cosine (the raw one where it is "
                             f"undefined) between their members is ≥ this (default: {DEFAULT_THRESHOLD})")
    parser.add_argument("--method", default="dp_aware", choices=sorted(METHOD_PARAMETERS),
                        help="merge method of the generated configs, with merge_configs/' parameters "
                             "(default: dp_aware)")
    parser.add_argument("--base", help="base model the adapters were trained from (default: the runs' "
                                       "shared <runs>/base)")
    parser.add_argument("--output_dir", default="similarity", help="where the results go (default: similarity)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a previous similarity output in --output_dir")


def default_base(runs: list[str]) -> Path:
    """``<runs>/base`` shared by every run given (an adapter folder is taken as ``<runs>/<task>/<adapter>``)."""
    folders = {Path(run).parent if is_peft_adapter(run) else Path(run) for run in runs}
    parents = {folder.parent for folder in folders}
    base = next(iter(parents)) / BASE_DIR
    if len(parents) != 1 or not (base / "config.json").is_file():
        raise FileNotFoundError("the runs given share no <runs>/base/config.json: pass --base")
    return base


def run(args: argparse.Namespace) -> int:
    from hf_dpmerge.merging.planning.merge_groups import merge_groups, write_group_configs
    from hf_dpmerge.merging.planning.similarity_plot import plot_similarity
    from hf_dpmerge.merging.planning.task_similarity import load_task_vector, task_similarity
    from hf_dpmerge.utils.io import staged_directory
    from hf_dpmerge.utils.own_output import check_own_output

    output = Path(args.output_dir)
    check_own_output(output, overwrite=args.overwrite, marker=RESULTS_NAME, output="similarity output",
                     flag="--output_dir")
    report = task_similarity([load_task_vector(run) for run in args.runs])
    base = Path(args.base) if args.base else default_base(args.runs)
    if not (base / "config.json").is_file():
        raise FileNotFoundError(f"--base {base} has no config.json: give the base model the adapters trained from")
    groups = merge_groups(report, args.threshold)
    print(report.table())
    print(f"\nmerge groups at cosine ≥ {args.threshold:g} (the noise-aware interval's lower end, average linkage):")
    with staged_directory(output) as staged:
        staged.mkdir()
        results = {**report.to_dict(), "threshold": args.threshold, "groups": groups, "method": args.method}
        (staged / RESULTS_NAME).write_text(json.dumps(results, indent=2) + "\n")
        plot_similarity(report, staged / HEATMAP_NAME, groups)
        configs = iter(write_group_configs(report, groups, base, args.method, staged, output))
        for group in groups:
            where = f"-> {output / next(configs).name}" if len(group) > 1 else "(alone: use its adapter as it is)"
            print(f"  {', '.join(group)} {where}")
    print(f"\nsaved {output / RESULTS_NAME}, {output / HEATMAP_NAME} and the group configs in {output}")
    return 0
