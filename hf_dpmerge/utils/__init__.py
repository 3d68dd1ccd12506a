"""Helpers every layer may use: atomic file and directory output (:mod:`.io`) and the names of peft's adapter
files (:mod:`.adapter_files`). They import nothing else from the package."""
