"""The package's imports flow one way (docs/architecture.md, "Layers"): every import of a hf_dpmerge module — at module
level, inside a function or under TYPE_CHECKING — goes to the importer's own package or to one it may use, and
the module graph has no cycle. benchmarks/ and examples/ reach the package by its name only."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "hf_dpmerge"

_LOW = {"utils", "lazy_exports"}
_NOISE = _LOW | {"records", "lora", "noise"}
_MODELS = _NOISE | {"data", "modeling"}
_LIBRARY = _MODELS | {"training", "analysis", "merging", "audit", "hub", "federated"}
MAY_IMPORT: dict[str, set[str]] = {
    "utils": set(),
    "lazy_exports": set(),
    "records": {"utils"},
    "data": _LOW,
    "modeling": _LOW,
    "lora": _LOW,
    "noise": _LOW | {"records", "lora"},
    "training": _MODELS,
    "analysis": _MODELS,
    "merging": _NOISE,
    "audit": _MODELS | {"training"},
    "federated": _MODELS | {"training", "analysis", "merging"},
    "hub": _LOW | {"records", "modeling", "analysis"},
    "scripts": _LIBRARY | {"", "scripts"},
    "cli": _LIBRARY | {"", "scripts"},
    "": _LOW,  # hf_dpmerge/__init__.py: the public names are strings, imported lazily
}
"""Top-level part of the package (``""`` is ``hf_dpmerge`` itself) → the parts it may import besides itself."""


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part(module: str) -> str:
    """``hf_dpmerge.training.dp.state`` → ``training``; ``hf_dpmerge`` → ``""``."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else ""


def imported_modules(source: str, importer: str, is_package: bool, modules: set[str]) -> set[str]:
    """Every hf_dpmerge module ``source`` imports; ``from pkg import name`` counts as ``pkg.name`` when that is
    one of ``modules``, else as ``pkg``; relative imports are resolved against ``importer``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = importer.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names}
    return {name for name in found if name == "hf_dpmerge" or name.startswith("hf_dpmerge.")}


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    paths = sorted(root.rglob("*.py"))
    modules = {module_name(path, root) for path in paths}
    return {
        module_name(path, root): imported_modules(path.read_text(), module_name(path, root),
                                                  path.name == "__init__.py", modules)
        for path in paths
    }


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for importer, imported in graph.items():
        allowed = MAY_IMPORT.get(part(importer))
        if allowed is None:
            bad.append(f"{importer}: its part {part(importer)!r} has no place in MAY_IMPORT")
            continue
        bad += [f"{importer} imports {target}" for target in sorted(imported)
                if part(target) != part(importer) and part(target) not in allowed]
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules (imports of a package count as its __init__)."""
    found, done, stack = [], set(), []

    def visit(module: str) -> None:
        if module in stack:
            found.append(stack[stack.index(module):] + [module])
            return
        if module in done:
            return
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            visit(target)
        stack.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)
    return found


def test_imports_flow_down_the_layers() -> None:
    assert upward_imports(import_graph()) == []


def test_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_every_part_of_the_package_has_a_layer() -> None:
    parts = {part(module) for module in import_graph()}
    assert parts <= set(MAY_IMPORT), parts - set(MAY_IMPORT)


@pytest.mark.parametrize(("importer", "line", "problem"), [
    ("records/record.py", "from hf_dpmerge.training.dpsam_trainer import DPSAMTrainer",
     "hf_dpmerge.records.record imports hf_dpmerge.training.dpsam_trainer"),
    ("merging/methods/mergekit_methods.py", "from hf_dpmerge.data.tasks import TaskSpec",
     "hf_dpmerge.merging.methods.mergekit_methods imports hf_dpmerge.data.tasks"),
    ("analysis/drift.py", "    from hf_dpmerge.training.sam import SAM_MODES",
     "hf_dpmerge.analysis.drift imports hf_dpmerge.training.sam"),
    ("training/release.py", "from ..merging import methods",
     "hf_dpmerge.training.release imports hf_dpmerge.merging.methods"),
    ("noise/variance.py", "    from hf_dpmerge.training.sam import SAM_MODES",
     "hf_dpmerge.noise.variance imports hf_dpmerge.training.sam"),
    ("noise/collection.py", "from hf_dpmerge.merging.inputs import RECORD_OVERRIDES",
     "hf_dpmerge.noise.collection imports hf_dpmerge.merging.inputs"),
])
def test_an_upward_import_is_caught(tmp_path: Path, importer: str, line: str, problem: str) -> None:
    copy = _copy_package(tmp_path)
    target = copy / importer
    source = target.read_text()
    if line.startswith(" "):  # inside a function body
        source += f"\n\ndef _added():\n{line}\n"
    else:
        source += f"\n{line}\n"
    target.write_text(source)
    assert problem in upward_imports(import_graph(copy))


def test_a_cycle_is_caught(tmp_path: Path) -> None:
    copy = _copy_package(tmp_path)
    state = copy / "training" / "dp" / "state.py"
    upward = "\nif False:\n    from hf_dpmerge.training.dpsam_trainer import DPSAMTrainer\n"
    state.write_text(state.read_text() + upward)
    assert any("hf_dpmerge.training.dp.state" in cycle for cycle in cycles(import_graph(copy)))


def _copy_package(tmp_path: Path) -> Path:
    copy = tmp_path / "hf_dpmerge"
    for path in PACKAGE.rglob("*.py"):
        target = copy / path.relative_to(PACKAGE)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text())
    return copy


def _python_files(*folders: str) -> Iterable[Path]:
    for folder in folders:
        yield from (REPO / folder).rglob("*.py")


@pytest.mark.parametrize("path", sorted(_python_files("benchmarks", "examples")),
                         ids=lambda path: str(path.relative_to(REPO)))
def test_scripts_reach_the_package_by_name_only(path: Path) -> None:
    """No sys.path edits and no loading of files by path: what a script needs lives in hf_dpmerge."""
    source = path.read_text()
    assert "sys.path" not in source
    assert "spec_from_file_location" not in source
