"""One benchmark harness: a study declares its plan, how to run one unit and its report; :func:`main` gives every
study the same command line and the same store.

A unit is a name plus its full settings. :class:`Store` keeps one JSON per unit and reuses a stored result only when
the study's schema and the unit's settings both match, so a changed setting reruns its units and nothing needs a
shim. Studies live in ``benchmarks/studies/<name>.py``, run as ``python -m benchmarks.studies.<name>``, keep units
and report files in ``benchmarks/reports/<name>/`` and read other studies' stored units (:func:`stored`), never
their modules. What the package reads from a study is one of its :meth:`Study.exports`.

    python -m benchmarks.studies.data_size --plan          # the units, marked done or to run
    python -m benchmarks.studies.data_size                 # run what is missing, then write the report
    python -m benchmarks.studies.data_size --report-only   # the report from the stored units
"""

from __future__ import annotations

import abc
import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hf_dpmerge.utils.io import write_bytes_atomic, write_text_atomic

REPO = Path(__file__).resolve().parent.parent
REPORTS = REPO / "benchmarks" / "reports"


@dataclass(frozen=True)
class Unit:
    """One resumable piece of work: ``name`` (its file name) and every setting its result depends on; ``rerun``: run
    it even when stored (the plan found that its stored result is not all it is needed for, e.g. a folder it kept
    is gone)."""

    name: str
    settings: dict[str, Any] = field(hash=False)
    rerun: bool = False


class Store:
    """One JSON per unit under ``root``: ``{"schema", "settings", "result"}``."""

    def __init__(self, root: Path, schema: int):
        self.root, self.schema = Path(root), schema

    def path(self, unit: Unit) -> Path:
        return self.root / f"{unit.name}.json"

    def load(self, unit: Unit) -> dict[str, Any] | None:
        """The unit's stored result, or None when it is missing or was made under another schema or settings."""
        path = self.path(unit)
        if not path.is_file():
            return None
        stored = json.loads(path.read_text())
        same = stored.get("schema") == self.schema and stored.get("settings") == _jsonable(unit.settings)
        return stored["result"] if same else None

    def save(self, unit: Unit, result: dict[str, Any]) -> None:
        text = json.dumps({"schema": self.schema, "settings": _jsonable(unit.settings), "result": result},
                          indent=1, allow_nan=True)
        write_text_atomic(self.path(unit), text + "\n")

    def results(self) -> list[dict[str, Any]]:
        """Every stored unit of this schema, as ``{"name", "settings", "result"}``, sorted by name."""
        found = []
        for path in sorted(self.root.glob("*.json")):
            stored = json.loads(path.read_text())
            if stored.get("schema") == self.schema:
                found.append({"name": path.stem, "settings": stored["settings"], "result": stored["result"]})
        return found


def listed(text: str, known: Sequence[str], option: str) -> list[str]:
    """A comma-separated option's values, each one of ``known`` (else a ValueError, a usage error in a plan)."""
    values = text.split(",")
    if unknown := sorted(set(values) - set(known)):
        raise ValueError(f"{option}: unknown {unknown}; choose among {list(known)}")
    return values


def stored(study: str, schema: int) -> list[dict[str, Any]]:
    """Another study's stored units (:meth:`Store.results` of ``benchmarks/reports/<study>/units``)."""
    return Store(REPORTS / study / "units", schema).results()


class Study(abc.ABC):
    """What a study declares (``benchmarks/studies/<name>.py``): ``name`` (its module's) and the ``schema`` of its
    stored results; its options, plan, one unit's run and report files; the package files it exports."""

    name: str
    schema: int

    def __init_subclass__(cls, name: str, schema: int, **kwargs: Any) -> None:
        """``class MyStudy(Study, name="my_study", schema=1)``: the module's name and the results' schema."""
        super().__init_subclass__(**kwargs)
        cls.name, cls.schema = name, schema

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:  # noqa: B027 - a study may have no options
        """The study's own options (none by default)."""

    @abc.abstractmethod
    def plan(self, args: argparse.Namespace) -> Sequence[Unit]:
        """The units to run, in order (a ValueError is a usage error)."""

    @abc.abstractmethod
    def run(self, unit: Unit, work_dir: Path) -> dict[str, Any]:
        """One unit's result (JSON)."""

    @abc.abstractmethod
    def report(self, stored: list[dict[str, Any]]) -> dict[str, str | bytes]:
        """File name under ``benchmarks/reports/<name>/`` → markdown (or a plot's bytes), from every stored unit."""

    def exports(self, stored: list[dict[str, Any]]) -> dict[str, str]:
        """Path in the repository → text of each file the package reads from this study (none by default)."""
        return {}


def main(study: Study, argv: list[str] | None = None, log: Callable[[str], None] | None = None) -> int:
    """Run ``study``'s missing units (``--plan``: list them; ``--report-only``: none), then write its report files
    and exports from every stored unit."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.studies.{study.name}",
                                     description=sys.modules[type(study).__module__].__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", type=Path, default=REPO / "runs" / study.name,
                        help="scratch space for training (default: runs/<study>)")
    parser.add_argument("--units-dir", type=Path, default=REPORTS / study.name / "units",
                        help="where the units are stored (default: benchmarks/reports/<study>/units)")
    parser.add_argument("--out", type=Path, default=REPO,
                        help="write the report files and exports under this folder, laid out as in the repository "
                             "(default: the repository)")
    parser.add_argument("--report-only", action="store_true", help="run nothing; write the report")
    parser.add_argument("--plan", action="store_true", help="list the planned units and whether each is done")
    study.add_arguments(parser)
    args = parser.parse_args(argv)
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    store = Store(args.units_dir, study.schema)
    try:
        plan = [] if args.report_only else list(study.plan(args))
    except ValueError as error:
        parser.error(str(error))
    def done(unit: Unit) -> bool:
        return not unit.rerun and store.load(unit) is not None

    if args.plan:
        for unit in plan:
            print(f"{'done' if done(unit) else 'todo'}  {unit.name}")
        return 0
    for unit in plan:
        if done(unit):
            continue
        log(f"[{study.name}] {unit.name}")
        start, work_dir = time.perf_counter(), args.work_dir.resolve()
        result = json.dumps(study.run(unit, work_dir), allow_nan=True).replace(str(work_dir), "<work>")  # no local path
        store.save(unit, {**json.loads(result), "seconds": round(time.perf_counter() - start, 1)})
    results = store.results()
    reports = {REPORTS.relative_to(REPO) / study.name / name: text for name, text in study.report(results).items()}
    for path, text in {**reports, **study.exports(results)}.items():
        write_bytes_atomic(args.out / path, text.encode() if isinstance(text, str) else text)
        log(f"wrote {args.out / path}")
    return 0


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, allow_nan=True))
