"""Start-up hook for hf_dpmerge: registers its mergekit merge methods when mergekit is imported.

Installed at the top of site-packages beside ``_hf_dpmerge_mergekit.pth`` (an ``import`` line, Python < 3.15)
and ``_hf_dpmerge_mergekit.start`` (a PEP 829 entry point, Python >= 3.15; its presence disables the .pth
import line). :func:`install` only puts a finder on ``sys.meta_path``; nothing is imported until
``mergekit.merge_methods`` is, right after which ``hf_dpmerge.merging.methods.registration.on_merge_methods_import``
registers the methods. Nothing else of mergekit is touched.
"""

import sys

_CALLBACKS = {
    "mergekit.merge_methods": "on_merge_methods_import",
}


class _CallbackLoader:
    """Delegates to the real loader and runs the callback once the module has executed."""

    def __init__(self, loader, callback):
        self._loader = loader
        self._callback = callback

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            import hf_dpmerge.merging.methods.registration as registration

            getattr(registration, self._callback)(module)
        except Exception as err:  # mergekit must keep working for its own methods
            import warnings

            warnings.warn(f"hf_dpmerge: could not hook into {module.__name__}: {err!r}", stacklevel=2)


class _Finder:
    """Meta-path finder that wraps the loader of ``mergekit.merge_methods`` and ignores everything else."""

    def find_spec(self, fullname, path, target=None):
        callback = _CALLBACKS.get(fullname)
        if callback is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _CallbackLoader(spec.loader, callback)
                return spec
        return None


def install():
    """Put the finder first on ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
