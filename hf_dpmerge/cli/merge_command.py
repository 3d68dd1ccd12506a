"""Merge models or adapters from a mergekit YAML config (alias of ``mergekit-yaml``, atomic output).

``hf-dpmerge merge CONFIG OUT [mergekit-yaml options]``: every option after the two paths (``--lora-merge-cache
DIR``, ``--cuda``, …) goes to mergekit unchanged. The merge is written into a temporary directory beside
OUT and renamed into place only when it succeeded, so a failed or killed merge leaves nothing at OUT; an
existing non-empty OUT is refused, and with ``--overwrite`` replaced only if it holds a previous merge.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="mergekit YAML configuration (e.g. merge_configs/dp.yaml)")
    parser.add_argument("out_path", help="output directory for the merged model")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing output directory that holds a previous merge")
    parser.epilog = "Options after the two paths (--lora-merge-cache DIR, --cuda, ...) go to mergekit-yaml unchanged."
    parser.set_defaults(accepts_extra=True)


def run(args: argparse.Namespace) -> int:
    import click
    import mergekit.scripts.run_yaml as run_yaml

    from hf_dpmerge.merging.config_edit import load_config_mapping
    from hf_dpmerge.merging.output_dir import check_merge_output, overwrite_allowed
    from hf_dpmerge.merging.registration import activate

    config = Path(args.config)
    load_config_mapping(config)
    check_merge_output(args.out_path, args.overwrite)
    activate()
    try:
        with overwrite_allowed(args.overwrite):
            code = run_yaml.main.main(
                [str(config), args.out_path, *args.extra], prog_name="hf-dpmerge merge", standalone_mode=False
            )
    except click.ClickException as err:
        print(f"hf-dpmerge merge: {err.format_message()}", file=sys.stderr)
        return 2
    except RuntimeError as err:  # mergekit reports most problems as RuntimeError
        print(f"hf-dpmerge merge: error: {err}", file=sys.stderr)
        return 1
    if code is not None:  # --help and the like: click returns an exit code instead of running the merge
        return int(code)
    print(f"merged model written to {args.out_path}")
    return 0
