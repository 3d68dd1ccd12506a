"""``hf-dpmerge merge CONFIG OUT [mergekit-yaml options]``: merge models or adapters from a mergekit YAML config.

An alias of ``mergekit-yaml`` (options after the two paths go to mergekit unchanged) that runs
:func:`hf_dpmerge.merging.run.merge`: every input is checked before anything is written (misspelt keys, inputs whose
record names another base, our methods' settings), and the output is written atomically, replacing only a previous
merge and only with ``--overwrite``. ``--as-adapter`` merges shared-A LoRA adapters in factor space into a LoRA
adapter (:mod:`~hf_dpmerge.merging.adapters.adapter_merge`); ``--list-methods`` lists mergekit's methods, ours included.
The policy, and what plain ``mergekit-yaml`` does instead: docs/workflow.md, docs/merging.md, docs/bad-inputs.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="mergekit YAML configuration (e.g. merge_configs/dp.yaml)")
    parser.add_argument("out_path", nargs="?", help="output directory for the merged model")
    parser.add_argument("--list-methods", "--list_methods", dest="list_methods", action="store_true",
                        help="list the merge methods mergekit knows (hf_dpmerge's included) and exit")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing output directory that holds a previous merge")
    parser.add_argument("--as-adapter", "--as_adapter", dest="as_adapter", action="store_true",
                        help="merge shared-A LoRA adapters (trained with --lora_freeze_a) into a LoRA adapter")
    parser.epilog = "Options after the two paths (--lora-merge-cache DIR, --cuda, ...) go to mergekit-yaml unchanged."
    parser.set_defaults(accepts_extra=True)


def list_methods() -> list[str]:
    """One line per registered merge method: name, pretty name, and whose it is."""
    from mergekit.merge_methods import registered_methods

    from hf_dpmerge.merging.methods.mergekit_methods import METHODS

    ours = {method.spec.name for method in METHODS}
    return [
        f"{method.spec.name:24} {'hf_dpmerge' if method.spec.name in ours else 'mergekit':10} "
        f"{method.spec.pretty_name or ''}"
        for method in sorted(registered_methods(), key=lambda m: m.spec.name)
    ]


def _click_command(overwrite: bool):
    """``mergekit-yaml``'s command line (its CONFIG OUT arguments and every merge option, from mergekit's own
    ``add_merge_options``) running :func:`hf_dpmerge.merging.run.merge` with each task's folder written."""
    import click
    from mergekit.options import PrettyPrintHelp, add_merge_options

    from hf_dpmerge.merging.run import merge
    from hf_dpmerge.scripts.task_folders import write_task_folders

    @click.command("hf-dpmerge merge", cls=PrettyPrintHelp)
    @click.argument("config_file")
    @click.argument("out_path")
    @add_merge_options
    def command(merge_options, config_file: str, out_path: str) -> None:
        merge_options.apply_global_options()
        merge(config_file, out_path, options=merge_options, overwrite=overwrite, finish=write_task_folders)

    return command


def run_as_adapter(config_path: str | Path, out_path: str | Path, overwrite: bool = False) -> Path:
    """The ``--as-adapter`` merge of the YAML at ``config_path`` into the adapter ``out_path``; as for a dense merge,
    every input whose privacy record names another base than the YAML's is refused first."""
    from hf_dpmerge.merging.adapters.adapter_merge import merge_shared_a_adapters
    from hf_dpmerge.merging.adapters.adapter_merge_config import adapter_merge_arguments
    from hf_dpmerge.merging.config_edit import read_merge_config
    from hf_dpmerge.merging.run import parse_config
    from hf_dpmerge.merging.validation import check_recorded_bases

    config = read_merge_config(config_path)
    arguments = adapter_merge_arguments(config)
    check_recorded_bases(parse_config(config)[0])
    return merge_shared_a_adapters(out_dir=out_path, overwrite=overwrite, **arguments)


def ignored_mergekit_options(extra: list[str]) -> str:
    """The mergekit-yaml options ``--as-adapter`` ignores (it runs without mergekit), checked to be mergekit's."""
    import click

    try:
        _click_command(False).make_context("hf-dpmerge merge", ["config", "out", *extra])
    except click.ClickException as err:
        raise ValueError(f"--as-adapter: {err.format_message()}") from None
    return " ".join(extra)


def run(args: argparse.Namespace) -> int:
    import click

    from hf_dpmerge.utils.user_errors import USAGE_ERROR, error_line

    if args.list_methods:
        print("\n".join(list_methods()))
        return 0
    if args.config is None or args.out_path is None:
        raise ValueError("give the merge CONFIG and the OUT directory (or --list-methods)")
    if args.as_adapter:
        if args.extra:
            print(f"hf-dpmerge merge: note: --as-adapter runs without mergekit and ignores "
                  f"{ignored_mergekit_options(args.extra)}", file=sys.stderr)
        print(f"merged adapter written to {run_as_adapter(args.config, args.out_path, args.overwrite)}")
        return 0
    try:
        code = _click_command(args.overwrite).main([args.config, args.out_path, *args.extra],
                                                   prog_name="hf-dpmerge merge", standalone_mode=False)
    except click.ClickException as err:
        print(error_line("hf-dpmerge merge", err.format_message()), file=sys.stderr)
        return USAGE_ERROR
    except RuntimeError as err:  # mergekit reports most problems (an unknown method, a bad config) as RuntimeError
        print(error_line("hf-dpmerge merge", err), file=sys.stderr)
        return USAGE_ERROR
    if code is not None:  # --help and the like: click returns an exit code instead of running the merge
        return int(code)
    print(f"merged model written to {args.out_path}")
    return 0
