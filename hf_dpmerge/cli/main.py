"""``hf-dpmerge``: the verbs that mergekit does not have (merge is an alias of ``mergekit-yaml``)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterable

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
# verb -> its line in ``hf-dpmerge --help``, so that the top-level help imports no verb module (none of torch,
# transformers, mergekit or peft): ``hf-dpmerge --help`` and ``--version`` start in well under a second
SUMMARIES: dict[str, str] = {
    "train": "train private LoRA adapters (examples/train_glue.py as a verb, every flag of the script)",
    "merge": "merge adapters from a mergekit YAML config (mergekit-yaml with input checks and atomic output)",
    "evaluate": "floor, individual and merged scores per task, gain retained, retention and interference",
    "probe": "a fresh linear probe per task on the base and the merged encoder's features",
    "diagnose": "geometry of each adapter and of the merge: sharpness, drift, interference",
    "push": "push a merged model, its heads, privacy records and model card to the Hub (or stage it)",
    "audit": "an empirical ε lower bound of a training configuration, from one run with canaries",
    "similarity": "task similarity and sign conflicts of adapters' task vectors, merge groups and their configs",
    "recommend": "which trainer and merge method for these adapters, from interference and DP noise",
    "federated": "federated DP fine-tuning on Flower: clients train LoRA adapters, the server aggregates",
    "weights": "a score-weighted copy of a mergekit config (weight = softmax(score / temperature))",
    "tune": "choose merge hyper-parameters on private validation data with a DP selection",
    "evolve": "search per-model merge weights with CMA-ES on private validation data, one DP choice a generation",
}


def build_parser(verbs: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The command line: every verb listed, the arguments of ``verbs`` (default: all) added from their modules."""
    from importlib.metadata import PackageNotFoundError, version

    parser = argparse.ArgumentParser(prog="hf-dpmerge", description=__doc__.replace("``", ""),
                                     allow_abbrev=False)
    try:
        installed = version("hf_dpmerge")
    except PackageNotFoundError:  # run from a source tree that was never installed
        installed = "unknown (not installed)"
    parser.add_argument("--version", action="version", version=f"hf-dpmerge {installed}")
    sub = parser.add_subparsers(dest="verb", required=True)
    loaded = set(VERBS if verbs is None else verbs)
    for verb, module_name in VERBS.items():
        if verb not in loaded:
            sub.add_parser(verb, help=SUMMARIES[verb])
            continue
        module = importlib.import_module(module_name)
        verb_parser = sub.add_parser(verb, help=SUMMARIES[verb], description=module.__doc__.replace("``", ""),
                                     formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
                                     add_help=getattr(module, "ADD_HELP", True))  # False: the verb adds its own
        module.add_arguments(verb_parser)
        verb_parser.set_defaults(run=module.run)
    return parser


def chosen_verb(argv: list[str]) -> str | None:
    """The verb ``argv`` names (its first word that is one), or None (``--help``, ``--version``)."""
    return next((word for word in argv if word in VERBS), None)


def main(argv: list[str] | None = None) -> int:
    """Run the verb of ``argv``; a user error (:mod:`hf_dpmerge.utils.user_errors`) is one ``hf-dpmerge <verb>:
    error: …`` line and exit status 2, anything else keeps its traceback."""
    from hf_dpmerge.utils.user_errors import USAGE_ERROR, error_line, is_user_error

    argv = list(sys.argv[1:] if argv is None else argv)
    verb = chosen_verb(argv)
    args, extra = build_parser(() if verb is None else (verb,)).parse_known_args(argv)
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
