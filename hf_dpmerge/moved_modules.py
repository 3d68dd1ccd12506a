"""Old import paths of modules that moved, kept importable: ``import hf_dpmerge.privacy.record`` returns the
module now at ``hf_dpmerge.records.record`` (the same module object, so monkeypatching either name works).

A finder appended to ``sys.meta_path`` by ``import hf_dpmerge`` answers only for the names in :data:`MOVED`, and
only after the regular finders have found no such file.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

MOVED: dict[str, str] = {
    "hf_dpmerge.privacy.record": "hf_dpmerge.records.record",
    "hf_dpmerge.privacy.fingerprint": "hf_dpmerge.records.fingerprint",
    "hf_dpmerge.privacy.statement": "hf_dpmerge.records.statement",
    "hf_dpmerge.privacy.atomic_write": "hf_dpmerge.utils.io",
    "hf_dpmerge.privacy.audit": "hf_dpmerge.audit.audit",
    "hf_dpmerge.privacy.canaries": "hf_dpmerge.audit.canaries",
    "hf_dpmerge.privacy.membership": "hf_dpmerge.audit.membership",
    "hf_dpmerge.privacy.one_run_bound": "hf_dpmerge.audit.one_run_bound",
    "hf_dpmerge.training.accounting": "hf_dpmerge.training.dp.accounting",
    "hf_dpmerge.training.privatizer": "hf_dpmerge.training.dp.privatizer",
    "hf_dpmerge.training.poisson_loader": "hf_dpmerge.training.dp.poisson_loader",
    "hf_dpmerge.training.cross_process": "hf_dpmerge.training.dp.cross_process",
    "hf_dpmerge.training.dp_state": "hf_dpmerge.training.dp.state",
    "hf_dpmerge.training.sharpness": "hf_dpmerge.training.sam",
    "hf_dpmerge.training.input_checks": "hf_dpmerge.training.checks",
    "hf_dpmerge.training.per_example_loss": "hf_dpmerge.modeling.per_example_loss",
    "hf_dpmerge.merging.staging": "hf_dpmerge.utils.io",
    "hf_dpmerge.merging.encoder_adapter": "hf_dpmerge.training.encoder_adapter",
    "hf_dpmerge.merging.merge_inputs": "hf_dpmerge.merging.inputs",
    "hf_dpmerge.merging.model_card": "hf_dpmerge.merging.privacy_section",
}


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module at its new path."""

    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """The new module is already executed."""


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old names in :data:`MOVED`."""

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        return None if new is None else importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    """Append the finder to ``sys.meta_path`` once."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
