"""Planning a merge: which adapters to merge together and with what (post-processing, no privacy cost).

:mod:`.task_similarity` (``hf-dpmerge similarity``) with :mod:`.similarity_plot`; :mod:`.merge_groups`: one
mergekit config per group; :mod:`.merge_recommendation` (``hf-dpmerge recommend``); :mod:`.score_weights`
(``hf-dpmerge weights``). See docs/merging.md.
"""
