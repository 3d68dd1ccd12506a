"""The public API resolves, and importing the package stays cheap (no torch until a name is used)."""

import importlib
import subprocess
import sys

import pytest

import hf_dpmerge
from hf_dpmerge.moved_modules import MOVED


def test_every_exported_name_resolves():
    for name in hf_dpmerge.__all__:
        assert getattr(hf_dpmerge, name) is not None, name


def test_import_is_lazy():
    code = "import sys, hf_dpmerge; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_moved_modules_import_under_their_old_path(old, new):
    """A user's ``import hf_dpmerge.privacy.record`` gets the module itself (not a copy) from its new home."""
    assert importlib.import_module(old) is importlib.import_module(new)


def test_an_unknown_old_path_still_fails():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("hf_dpmerge.privacy.nothing_here")
