"""Merges that stay LoRA adapters: shared-A adapters merged on their B factors (docs/design.md §15.2).

:mod:`.factor_space`: the merges in factor space; :mod:`.adapter_merge`: ``hf-dpmerge merge --as-adapter``;
:mod:`.adapter_merge_config`: which settings of the merge YAML a factor-space merge honours.
"""
