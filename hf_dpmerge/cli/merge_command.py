"""Merge models or adapters from a mergekit YAML config (alias of ``mergekit-yaml``, atomic output).

``hf-dpmerge merge CONFIG OUT [mergekit-yaml options]``: every option after the two paths (``--lora-merge-cache
DIR``, ``--cuda``, …) goes to mergekit unchanged. The merge is written into a temporary directory beside
OUT and renamed into place only when it succeeded, so a failed merge leaves nothing behind; an existing
non-empty OUT is refused unless ``--overwrite``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="mergekit YAML configuration (e.g. merge_configs/dp.yaml)")
    parser.add_argument("out_path", help="output directory for the merged model")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing non-empty output directory")
    parser.epilog = "Options after the two paths (--lora-merge-cache DIR, --cuda, ...) go to mergekit-yaml unchanged."
    parser.set_defaults(accepts_extra=True)


def run(args: argparse.Namespace) -> int:
    import click
    import mergekit.scripts.run_yaml as run_yaml

    from hf_dpmerge.merging.registration import activate
    from hf_dpmerge.merging.staging import staged_directory

    config = Path(args.config)
    if not config.is_file():
        raise FileNotFoundError(f"no merge config at {config}")
    target = Path(args.out_path)
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"{target} exists and is not a directory")
    if target.is_dir() and any(target.iterdir()) and not args.overwrite:
        raise FileExistsError(f"{target} exists and is not empty; pass --overwrite to replace it")
    activate()
    try:
        with staged_directory(target) as staged:  # same basename: mergekit titles the model card after it
            code = run_yaml.main.main(
                [str(config), str(staged), *args.extra], prog_name="hf-dpmerge merge", standalone_mode=False
            )
            merged = staged.exists()
    except click.ClickException as err:
        print(f"hf-dpmerge merge: {err.format_message()}", file=sys.stderr)
        return 2
    except RuntimeError as err:  # mergekit reports most problems as RuntimeError
        print(f"hf-dpmerge merge: error: {err}", file=sys.stderr)
        return 1
    if not merged:  # --help and the like
        return int(code or 0)
    print(f"merged model written to {target}")
    return 0
