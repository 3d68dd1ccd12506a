"""Analysis of trained adapters and merged models.

- :mod:`.evaluation`: individual vs merged scores per task (retention, interference) — ``hf-dpmerge evaluate``;
- :mod:`.diagnostics`: geometry diagnostics — ``hf-dpmerge diagnose`` — built from :mod:`.sharpness` (Sharp_t and
  the top Hessian eigenvalue), :mod:`.drift` (‖ΔW‖_F/‖W_0‖_F) and :mod:`.interpolation` (merge gap, Figure 2);
- shared pieces: :mod:`.task_run` (a task's run: its record, data and splits), :mod:`.task_models` (a task's own and
  merged models), :mod:`.batching` (length-sorted batches) and :mod:`.task_loss` (L_t and its gradient).
"""
