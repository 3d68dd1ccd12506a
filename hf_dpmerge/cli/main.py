"""``hf-dpmerge``: the verbs that mergekit does not have (merge is an alias of ``mergekit-yaml``)."""

from __future__ import annotations

import argparse
import importlib
import sys

# verb -> module exposing ``add_arguments(parser)`` and ``run(args) -> int``
VERBS: dict[str, str] = {
    "train": "hf_dpmerge.cli.train_command",
    "merge": "hf_dpmerge.cli.merge_command",
    "evaluate": "hf_dpmerge.cli.evaluate_command",
    "probe": "hf_dpmerge.cli.probe_command",
    "diagnose": "hf_dpmerge.cli.diagnose_command",
    "push": "hf_dpmerge.cli.push_command",
    "audit": "hf_dpmerge.cli.audit_command",
    "similarity": "hf_dpmerge.cli.similarity_command",
    "recommend": "hf_dpmerge.cli.recommend_command",
    "federated": "hf_dpmerge.cli.federated_command",
    "weights": "hf_dpmerge.cli.weights_command",
    "tune": "hf_dpmerge.cli.tune_command",
    "evolve": "hf_dpmerge.cli.evolve_command",
}


def build_parser() -> argparse.ArgumentParser:
    from importlib.metadata import PackageNotFoundError, version

    parser = argparse.ArgumentParser(prog="hf-dpmerge", description=__doc__)
    try:
        installed = version("hf_dpmerge")
    except PackageNotFoundError:  # run from a source tree that was never installed
        installed = "unknown (not installed)"
    parser.add_argument("--version", action="version", version=f"hf-dpmerge {installed}")
    sub = parser.add_subparsers(dest="verb", required=True)
    for verb, module_name in VERBS.items():
        module = importlib.import_module(module_name)
        verb_parser = sub.add_parser(verb, help=module.__doc__.strip().splitlines()[0],
                                     add_help=getattr(module, "ADD_HELP", True))  # False: the verb adds its own
        module.add_arguments(verb_parser)
        verb_parser.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the verb of ``argv``; a user error (:mod:`hf_dpmerge.utils.user_errors`) is one ``hf-dpmerge <verb>:
    error: …`` line and exit status 2, anything else keeps its traceback."""
    from hf_dpmerge.utils.user_errors import USAGE_ERROR, error_line, is_user_error

    args, extra = build_parser().parse_known_args(argv)
    if extra and not getattr(args, "accepts_extra", False):
        print(f"hf-dpmerge {args.verb}: error: unrecognized arguments: {' '.join(extra)}", file=sys.stderr)
        return USAGE_ERROR
    args.extra = extra
    try:
        return int(args.run(args) or 0)
    except (ValueError, OSError) as err:
        if not is_user_error(err):
            raise
        print(error_line(f"hf-dpmerge {args.verb}", err), file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
