"""What a released adapter carries about its privacy: the record (``dp_privacy.json``), the base-weights
fingerprint it names, the human-readable statement built from it, the privatised optimizer statistics
(``dp_noise_stats.safetensors``) and the release allow-list. The lowest layer above :mod:`hf_dpmerge.utils`."""
