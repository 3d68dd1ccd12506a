"""Merging: the mergekit methods ``cauchy_poe``, ``dp_aware``, ``tsv``, ``iso_c``, ``iso_cts``, ``wudi`` and
``safe_merge`` (:mod:`.methods`), merges that stay adapters (:mod:`.adapters`) and merge planning (:mod:`.planning`).

Here: :mod:`.run` (the one merge entry point), :mod:`.inputs` (each input's record, noise statistics and LoRA
factors), :mod:`.validation`, :mod:`.merge_config` and :mod:`.config_edit` (mergekit configs), :mod:`.lora_cache`,
:mod:`.privacy_section` (the README privacy section). The noise model is :mod:`hf_dpmerge.noise`; see docs/merging.md.

It imports only :mod:`hf_dpmerge.records`, :mod:`hf_dpmerge.lora`, :mod:`hf_dpmerge.noise` and
:mod:`hf_dpmerge.utils`. Nothing here is imported by ``import hf_dpmerge``; mergekit only by the modules using it.
"""
