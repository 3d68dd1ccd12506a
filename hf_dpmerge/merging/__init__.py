"""Merging: the mergekit methods ``cauchy_poe``, ``dp_aware``, ``tsv``, ``iso_c``, ``iso_cts``, ``wudi`` and
``safe_merge``, and what they need.

- :mod:`.cauchy_poe`, :mod:`.dp_aware`, :mod:`.sure_threshold`, :mod:`.noise_variance`, :mod:`.optimizer_response`,
  the spectral merges :mod:`.tsv`, :mod:`.iso`, :mod:`.wudi` with :mod:`.spectral` and the noise floor
  :mod:`.noise_floor`: the maths (torch only);
- :mod:`.methods`: mergekit method specs and per-tensor kernels (importing it registers them);
- :mod:`.inputs`: privacy records, noise statistics and LoRA factors of each input, per-model overrides
  (``RECORD_OVERRIDES``);
- :mod:`.validation`: checks of a merge configuration and its inputs before anything is written;
- :mod:`.lora_cache`: stale ``--lora-merge-cache`` entries are dropped before a merge;
- :mod:`.run`: :func:`~.run.merge`, the one merge entry point (``hf-dpmerge merge``, ``tune``, benchmarks);
  :mod:`.registration`: start-up-hook callbacks and the checks of a config using our methods;
  :mod:`.privacy_section`: the README privacy section; :mod:`.output_dir`: when an existing merge output may be
  replaced;
- :mod:`.task_similarity`, :mod:`.merge_groups`, :mod:`.merge_recommendation`: which adapters to merge together
  and with what (``hf-dpmerge similarity`` / ``recommend``); :mod:`.merge_config`: generated mergekit configs.

It imports only :mod:`hf_dpmerge.records`, :mod:`hf_dpmerge.lora` and :mod:`hf_dpmerge.utils` from the package.

Nothing here is imported by ``import hf_dpmerge``; mergekit is imported only by the modules that use it.
"""
