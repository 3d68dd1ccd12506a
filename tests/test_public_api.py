"""The public API resolves, and importing the package stays cheap (no torch until a name is used)."""

import subprocess
import sys

import hf_dpmerge


def test_every_exported_name_resolves():
    for name in hf_dpmerge.__all__:
        assert getattr(hf_dpmerge, name) is not None, name


def test_import_is_lazy():
    code = "import sys, hf_dpmerge; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
