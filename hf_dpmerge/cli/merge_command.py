"""Merge models or adapters from a mergekit YAML config (alias of ``mergekit-yaml``, atomic output).

``hf-dpmerge merge CONFIG OUT [mergekit-yaml options]``: every option after the two paths (``--lora-merge-cache
DIR``, ``--cuda``, …) goes to mergekit unchanged. It runs :func:`hf_dpmerge.merging.run.merge`: the merge is
written into a temporary directory beside OUT and renamed into place only when it succeeded, so a failed or
killed merge leaves nothing at OUT; an existing non-empty OUT is refused, and with ``--overwrite`` replaced only if
it holds a previous merge; misspelt keys are refused and ``cauchy_poe``/``dp_aware`` inputs are checked before
anything is written. This policy is this command's: plain ``mergekit-yaml`` keeps mergekit's own behaviour.
``hf-dpmerge merge --list-methods`` lists the
merge methods mergekit knows, ours included.

``--as-adapter`` merges shared-A LoRA adapters (``--lora_freeze_a``) in factor space and writes a LoRA adapter
instead of a model (:mod:`~hf_dpmerge.merging.adapter_merge`); it reads the same YAML (``merge_method``
``task_arithmetic`` or ``dp_aware``, ``models:`` as ``base+adapter``, ``parameters: lambda``, per-model ``weight``
and record overrides) without mergekit.
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

    from hf_dpmerge.merging.methods import METHODS

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


_AS_ADAPTER_SHARED = {"lambda", "allow_non_private", "shrinkage"}


def run_as_adapter(config_path: str | Path, out_path: str | Path, overwrite: bool = False) -> Path:
    """The ``--as-adapter`` merge of the YAML at ``config_path`` into the adapter ``out_path``."""
    from mergekit.common import ModelReference

    from hf_dpmerge.merging.adapter_merge import merge_shared_a_adapters
    from hf_dpmerge.merging.config_edit import read_merge_config
    from hf_dpmerge.merging.inputs import RECORD_OVERRIDES

    config = read_merge_config(config_path)
    shared = dict(config.get("parameters") or {})
    poe = _cauchy_poe_settings(shared) if config.get("merge_method") == "cauchy_poe" else None
    if unknown := sorted(set(shared) - _AS_ADAPTER_SHARED - set(poe or ())):
        raise ValueError(
            f"--as-adapter: unknown or unsupported parameter {unknown}; it takes {sorted(_AS_ADAPTER_SHARED)} "
            "and cauchy_poe's own (precision_sign and random_effects act on dense coordinates: use the dense merge)"
        )
    adapters, weights, overrides = [], [], []
    for entry in config["models"]:
        reference = ModelReference.parse(entry["model"] if isinstance(entry, dict) else entry)
        if reference.lora is None:
            raise ValueError(f"--as-adapter: input {reference} is not base+adapter; give each input as BASE+ADAPTER")
        settings = dict((entry.get("parameters") or {}) if isinstance(entry, dict) else {})
        weights.append(float(settings.pop("weight", 1.0)))
        if unknown := sorted(set(settings) - set(RECORD_OVERRIDES) - {"noise_std"}):
            raise ValueError(f"--as-adapter: input {reference} has unknown per-model parameter {unknown}")
        adapters.append(reference.lora.path)
        overrides.append(settings)
    base = config.get("base_model")
    if "lambda" not in shared:
        raise ValueError("--as-adapter needs `parameters: {lambda: …}` (the merged task vector's scale has no default)")
    return merge_shared_a_adapters(
        adapters, out_path, method=config.get("merge_method"), lam=float(shared["lambda"]),
        weights=weights, overrides=overrides, base_model=None if base is None else str(base),
        allow_non_private=bool(shared.get("allow_non_private", False)), overwrite=overwrite,
        shrinkage=str(shared.get("shrinkage", "scale")), poe_options=poe,
    )


def _cauchy_poe_settings(shared: dict) -> dict:
    """cauchy_poe's shared settings of the YAML, validated and defaulted as its mergekit method does (one
    source: :class:`hf_dpmerge.merging.methods.CauchyPoEMethod`'s parameter specs), ``lambda`` left out."""
    from mergekit.merge_methods.base import MISSING, ParameterScope

    from hf_dpmerge.merging.methods import CauchyPoEMethod

    specs = {spec.name: spec for spec in CauchyPoEMethod().spec.parameters
             if spec.scope == ParameterScope.SHARED and spec.name != "lambda"}
    settings = {}
    for name, spec in specs.items():
        value = shared.get(name, spec.default)
        try:
            settings[name] = spec.validate(value) if value is not MISSING else value
        except ValueError as err:
            raise ValueError(f"--as-adapter: cauchy_poe parameter {name}={value!r}: {err}") from None
    return settings


def run(args: argparse.Namespace) -> int:
    import click

    if args.list_methods:
        print("\n".join(list_methods()))
        return 0
    if args.config is None or args.out_path is None:
        raise ValueError("give the merge CONFIG and the OUT directory (or --list-methods)")
    if args.as_adapter:
        if args.extra:
            raise ValueError(f"--as-adapter runs without mergekit: it takes no mergekit options ({args.extra})")
        print(f"merged adapter written to {run_as_adapter(args.config, args.out_path, args.overwrite)}")
        return 0
    try:
        code = _click_command(args.overwrite).main([args.config, args.out_path, *args.extra],
                                                   prog_name="hf-dpmerge merge", standalone_mode=False)
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
