"""Push a merged model, its per-task heads and privacy records, and a model card to the Hugging Face Hub.

Example::

    hf-dpmerge push merged/ --repo_id you/dp-merged --runs runs --tasks rotten_tomatoes,bbc_news \\
        --eval_json eval/results.json             # private repo by default; --public to publish
    hf-dpmerge push merged/ --dry-run             # write the card + staged folder, list files, no network
    hf-dpmerge push merged_causal/ --runs runs_causal --dry-run   # a merged causal LM (examples/train_causal_lm.py)
    hf-dpmerge push --multi_adapter --runs runs --dry-run  # unmerged: the base once, each task's adapter (stock peft)

An adapter whose privacy record names another base than the merge's (the ``base_model`` of MERGED_DIR's
``mergekit_config.yml``, else ``<runs>/base``) is refused before anything is staged.

Causal-LM runs release the merged LM itself at the repository root (``pipeline("text-generation")``) with each
task's ``<task>/dp_privacy.json``; their ``--eval_json`` is the causal ``results.json`` of ``hf-dpmerge evaluate``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hf_dpmerge.data.tasks import parse_task_list
from hf_dpmerge.hub.causal_release import push_merged_causal_lm
from hf_dpmerge.hub.multi_adapter import MULTI_ADAPTER_COMMIT_MESSAGE, MULTI_ADAPTER_DIR, push_multi_adapter
from hf_dpmerge.hub.push import DEFAULT_COMMIT_MESSAGE, PushResult, push_merged_model
from hf_dpmerge.hub.staging import PushError
from hf_dpmerge.records.run_folders import ADAPTER_DIR, BASE_DIR, run_adapters


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("merged_dir", metavar="MERGED_DIR", nargs="?",
                        help="merged model directory (mergekit-yaml output); none with --multi_adapter")
    parser.add_argument(
        "--multi_adapter", "--multi-adapter", dest="multi_adapter", action="store_true",
        help="release the runs' base once and every task's adapter (LoRA + head) under <task>/, unmerged: each task "
             "scores its individual column (stock peft: PeftModel.from_pretrained(base, repo, subfolder=task))",
    )
    parser.add_argument("--repo_id", help="Hub repository, user/name (optional with --dry-run)")
    parser.add_argument("--runs", default="runs", help="training output folder holding <task>/adapter/ (default: runs)")
    parser.add_argument(
        "--tasks",
        help="comma-separated tasks to release (default: every <runs>/<task>/adapter/)",
    )
    parser.add_argument("--eval_json", help="evaluation results written by `hf-dpmerge evaluate`")
    parser.add_argument(
        "--merge_config", help="merge YAML to quote in the card (default: MERGED_DIR/mergekit_config.yml)"
    )
    parser.add_argument(
        "--base_model", help="Hub id of the base model for the card metadata (default: from the privacy records)"
    )
    parser.add_argument("--license", default="apache-2.0", help="licence in the card metadata (default: apache-2.0)")
    parser.add_argument("--public", action="store_true", help="create a public repository (default: private)")
    parser.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true",
                        help="stage the release locally and list its files; upload nothing")
    parser.add_argument(
        "--staging_dir", help="where --dry-run writes the staged folder (default: <MERGED_DIR>-hub; with "
                              f"--multi_adapter {MULTI_ADAPTER_DIR} beside --runs)"
    )
    parser.add_argument(
        "--allow-seeded", "--allow_seeded", dest="allow_seeded", action="store_true",
        help="release adapters trained with a fixed dp_seed (or whose record predates the 'seeded' field), or a "
             "merge selected by hf-dpmerge tune/evolve with a fixed --seed; anyone holding the seed can undo their "
             "noise, and the card says so",
    )
    parser.add_argument("--token", help="Hub token (default: HF_TOKEN or the saved login)")
    parser.add_argument("--commit_message",
                        help=f"message of the Hub commit of the release (default {DEFAULT_COMMIT_MESSAGE!r}; with "
                             f"--multi_adapter {MULTI_ADAPTER_COMMIT_MESSAGE!r})")


def _adapters(runs: Path, tasks: str | None) -> dict[str, Path]:
    if tasks:
        return {t: runs / t / ADAPTER_DIR for t in parse_task_list(tasks)}
    found = run_adapters(runs)
    if not found:
        raise PushError(f"no adapters under {runs}/<task>/adapter/: train some first, or pass --runs/--tasks")
    return found


def _causal_adapters(adapters: dict[str, Path]) -> bool:
    """Whether the adapters are causal-LM runs (examples/train_causal_lm.py): their merged LM is released whole."""
    from hf_dpmerge.hub.causal_release import is_causal_release
    from hf_dpmerge.records.record import PRIVACY_RECORD_NAME, PrivacyRecord

    records = {task: PrivacyRecord.load(path) for task, path in adapters.items()
               if (path / PRIVACY_RECORD_NAME).is_file()}
    return bool(records) and is_causal_release(records)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _check_mode(args: argparse.Namespace) -> None:
    """MERGED_DIR is a merged release's, none of --multi_adapter's (which quotes no merge config)."""
    if args.multi_adapter and args.merged_dir is not None:
        raise PushError(f"--multi_adapter releases the runs' adapters unmerged, not {args.merged_dir}: drop "
                        "MERGED_DIR, or drop --multi_adapter to push that merge")
    if args.multi_adapter and args.merge_config:
        raise PushError("--merge_config quotes a merge, and --multi_adapter releases none: drop it")
    if not args.multi_adapter and args.merged_dir is None:
        raise PushError("MERGED_DIR is required (the mergekit-yaml output to release), or pass --multi_adapter to "
                        "release every task's adapter beside the shared base, unmerged")


def _release(args: argparse.Namespace, repo_id: str, adapters: dict[str, Path], private: bool) -> PushResult:
    """Stage (and upload, unless --dry-run) the release the flags ask for."""
    from hf_dpmerge.analysis.evaluation_report import EvaluationReport

    causal = _causal_adapters(adapters)
    evaluation = None
    if args.eval_json:
        evaluation = (json.loads(Path(args.eval_json).read_text(encoding="utf-8")) if causal
                      else EvaluationReport.load(args.eval_json))
    common = dict(adapters=adapters, evaluation=evaluation, private=private, dry_run=args.dry_run, token=args.token,
                  staging_dir=args.staging_dir, base_model=args.base_model, license=args.license,
                  allow_seeded=args.allow_seeded)
    if args.multi_adapter:
        return push_multi_adapter(args.runs, repo_id, commit_message=args.commit_message or
                                  MULTI_ADAPTER_COMMIT_MESSAGE, **common)
    release = push_merged_causal_lm if causal else push_merged_model
    return release(args.merged_dir, repo_id, commit_message=args.commit_message or DEFAULT_COMMIT_MESSAGE,
                   merge_config=args.merge_config, runs_base=Path(args.runs) / BASE_DIR, **common)


def run(args: argparse.Namespace) -> int:
    from huggingface_hub.errors import HfHubHTTPError

    try:
        import httpx2

        network_errors: tuple[type[BaseException], ...] = (HfHubHTTPError, httpx2.HTTPError, ConnectionError)
    except ImportError:  # pragma: no cover - other huggingface_hub releases
        network_errors = (HfHubHTTPError, ConnectionError)

    _check_mode(args)
    if args.staging_dir and not args.dry_run:
        raise PushError("--staging_dir only applies with --dry-run")
    repo_id = args.repo_id
    if repo_id is None:
        if not args.dry_run:
            raise PushError("--repo_id user/name is required (unless --dry-run)")
        name = "dp-adapters" if args.multi_adapter else Path(args.merged_dir).resolve().name
        repo_id = f"your-username/{name}"
    adapters = _adapters(Path(args.runs), args.tasks)
    private = not args.public
    try:
        result = _release(args, repo_id, adapters, private)
    except network_errors as err:
        print(f"hf-dpmerge push: upload to the Hub failed: {err}", file=sys.stderr)
        return 1
    visibility = "private" if private else "public"
    total = sum(size for _, size in result.files)
    if result.dry_run:
        staged = result.staging_dir
        print(f"Dry run: nothing uploaded. Staged release in {staged} (card: {staged / 'README.md'}).")
        print(f"A push would create the {visibility} repository {repo_id} and upload {len(result.files)} files "
              f"({_size(total)}):")
    else:
        print(f"Uploaded {len(result.files)} files ({_size(total)}) to the {visibility} repository {repo_id}:")
    for path, size in result.files:
        print(f"  {path}  ({_size(size)})")
    if result.commit_url:
        print(f"Commit: {result.commit_url}")
    return 0
