"""What a released adapter carries about its privacy: the record (``dp_privacy.json``), the base-weights
fingerprint it names, and the human-readable statement built from it. The lowest layer above :mod:`hf_dpmerge.utils`."""
