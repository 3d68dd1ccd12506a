"""Merging: the mergekit methods ``cauchy_poe`` and ``dp_aware``, and what they need.

- :mod:`.cauchy_poe`, :mod:`.dp_aware`, :mod:`.sure_threshold`, :mod:`.noise_variance`: the maths (torch only);
- :mod:`.methods`: mergekit method specs and per-tensor kernels (importing it registers them);
- :mod:`.merge_inputs`: privacy records and LoRA factors of each input, per-model overrides, input checks;
- :mod:`.registration`: start-up-hook callbacks and the guarded ``run_merge``; :mod:`.model_card`: the
  README privacy section;
- :mod:`.encoder_adapter`: an adapter's encoder LoRA weights without its task head; :mod:`.staging`:
  atomic directory output; :mod:`.output_dir`: when an existing merge output may be replaced.
- :mod:`.task_similarity`, :mod:`.merge_groups`, :mod:`.merge_recommendation`: which adapters to merge together
  and with what (``hf-dpmerge similarity`` / ``recommend``); :mod:`.merge_config`: generated mergekit configs.

Nothing here is imported by ``import hf_dpmerge``; mergekit is imported only by the modules that use it.
"""
