"""The public API resolves, and importing the package stays cheap (no torch until a name is used)."""

import importlib
import subprocess
import sys

import pytest

import hf_dpmerge


def test_every_exported_name_resolves():
    for name in hf_dpmerge.__all__:
        assert getattr(hf_dpmerge, name) is not None, name


def test_import_is_lazy():
    code = "import sys, hf_dpmerge; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


@pytest.mark.parametrize("old", ["hf_dpmerge.privacy.record", "hf_dpmerge.training.privatizer",
                                 "hf_dpmerge.moved_modules"])
def test_no_old_import_path_is_kept_alive(old):
    """A 0.1 package has one path per module: moved modules are not aliased under their old names."""
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)
