"""The mergekit merge methods, one module each, and their registration with mergekit.

The maths (torch only): :mod:`.cauchy_poe`, :mod:`.dp_aware`, the spectral :mod:`.tsv`, :mod:`.iso`, :mod:`.wudi`
on :mod:`.spectral`; :mod:`.mergekit_methods`: their mergekit parameter specs and per-tensor kernels (importing it
registers them); :mod:`.safe_merge`: the ``safe_merge`` method; :mod:`.registration`: the start-up hook's callback
and the checks of a config using our methods. See docs/merging.md.
"""
