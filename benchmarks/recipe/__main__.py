"""``python -m benchmarks.recipe``: run the select stage, then the report stage, then write the report."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import __doc__ as DESCRIPTION
from .grid import RECIPES, Unit, report_units, select_units
from .report import choose_recipe, write_report
from .run import REPO, UNITS_DIR, load_result, run_unit

DEFAULT_SECONDS = 150.0  # a LoRA adapter of DP_RECIPE on 2 cores, before any unit is measured


def stored(units_dir: Path) -> dict[str, dict]:
    """Every stored unit result that matches today's command line for its unit."""
    results = {}
    for path in units_dir.rglob("*.json"):
        result = json.loads(path.read_text())
        unit = Unit(**result["unit"])
        if load_result(unit, units_dir) is not None:
            results[unit.name] = result
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.recipe", description=DESCRIPTION.splitlines()[0],
                                     epilog=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", type=Path, default=REPO / "runs" / "recipe",
                        help="where adapters are trained (deleted after scoring; default: runs/recipe)")
    parser.add_argument("--units-dir", type=Path, default=UNITS_DIR, help="where unit results are stored")
    parser.add_argument("--report", type=Path, default=UNITS_DIR.parent / "RECIPES.md", help="the report file")
    parser.add_argument("--max-units", type=int, help="stop after training this many units (resume later)")
    parser.add_argument("--plan", action="store_true", help="list the units still to train and their time")
    parser.add_argument("--report-only", action="store_true", help="rewrite the report from stored units")
    args = parser.parse_args(argv)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731

    results = stored(args.units_dir)
    if not args.report_only:
        chosen, _ = choose_recipe(results)
        todo = [u for u in select_units() if u.name not in results]
        todo += [u for u in report_units(chosen) if u.name not in results] if chosen else []
        if args.plan:
            measured = [r["train_seconds"] for r in results.values()]
            per_unit = sum(measured) / len(measured) if measured else DEFAULT_SECONDS
            print(f"{len(todo)} units to train{'' if chosen else ' in the select stage (the report stage follows)'}"
                  f", ≈ {len(todo) * per_unit / 60:.0f} min at {per_unit:.0f} s per unit")
            for unit in todo:
                print(f"  {unit.name}: {' '.join(RECIPES[unit.recipe].flags) or '(DP_RECIPE)'}")
            return 0
        trained = 0
        while todo and (args.max_units is None or trained < args.max_units):
            unit = todo.pop(0)
            log(f"[recipe] {unit.name}")
            results[unit.name] = run_unit(unit, args.work_dir.resolve(), args.units_dir)
            trained += 1
            if not todo and (chosen := choose_recipe(results)[0]) is not None:
                todo = [u for u in report_units(chosen) if u.name not in results]
    write_report(results, args.report, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
