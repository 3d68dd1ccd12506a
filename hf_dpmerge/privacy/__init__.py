"""Old home of the privacy record (now :mod:`hf_dpmerge.records`) and the audit (now :mod:`hf_dpmerge.audit`);
``hf_dpmerge.privacy.<module>`` still imports, through :mod:`hf_dpmerge.moved_modules`."""
