"""The DP noise model of a release and of a merge (docs/design.md §6), one concept per module.

- :mod:`.collection`: what training collects at release (``dp_noise_stats.safetensors``, its format in
  :mod:`hf_dpmerge.records.noise_record`); :mod:`.linearised_response`: Adam's noise response along the run;
- :mod:`.optimizer_response`: the noise an optimizer leaves in a parameter; :mod:`.variance`: per coordinate of a
  released task vector;
- :mod:`.shrinkage`, :mod:`.sure_threshold`: SURE-optimal denoising; :mod:`.floor`: the Marchenko–Pastur noise floor.

It imports only :mod:`hf_dpmerge.records`, :mod:`hf_dpmerge.lora` and :mod:`hf_dpmerge.utils` from the package.
"""
