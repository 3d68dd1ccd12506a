"""Quality benchmark: private adapters, their merges and their geometry on real packaged tasks → BENCHMARKS.md.

For every training cell (trainer × ε × seed) it trains one LoRA adapter per task through the code path of
``examples/train_glue.py`` (:func:`hf_dpmerge.scripts.train.train_task` from one shared base; ``DP_RECIPE`` + the
grid's flags + the trainer's flags), measures each adapter's sharpness, top Hessian eigenvalue and drift on a
validation subset (:func:`hf_dpmerge.analysis.diagnostics.diagnose_runs`), then merges the cell's adapters with
every merge method (configs generated from ``merge_configs/*.yaml``, merged by ``hf-dpmerge merge``, i.e.
``mergekit-yaml``), scores individual, merged and normalised accuracy on the test split
(:func:`hf_dpmerge.analysis.evaluation.evaluate_runs`) and the merge gap and interpolation curve on the validation
subset.

Each finished unit (one task's training, one cell's merge) writes a JSON under ``<work-dir>/results``; a rerun
skips every unit whose JSON exists with the same settings, so an interrupted run resumes. The report
(``BENCHMARKS.md`` and ``benchmarks/plots/*.png`` under ``--report-dir``) is generated from those JSONs only.

    python -m benchmarks.quality --grid cpu --plan     # list the runs and estimate their time; train nothing
    python -m benchmarks.quality --grid cpu            # reduced grid for 2 CPU cores (see --plan)
    python -m benchmarks.quality --grid full           # the full grid, for a GPU
    python -m benchmarks.quality --grid smoke --work-dir /tmp/quality-smoke   # minutes: it runs and resumes
    python -m benchmarks.quality --grid stress --plan  # the stress grid: headline and rest timed apart
    python -m benchmarks.quality --grid stress         # → BENCHMARKS_STRESS.md; --grid stress-full for a GPU

The stress grids make merging hard and compare fairly: six overlapping tasks, LoRA on every layer and module, a
head-only floor and gain retained, every merge tuned alike on validation (test read once), a noise-injection arm,
and paired significance tests on per-example scores.

Modules: :mod:`.grid` (grids, cells, trainer flags), :mod:`.units` (one unit: a task's training or a cell's merge),
:mod:`.store` (one JSON per finished unit), :mod:`.time_model` (``--plan``'s estimate), :mod:`.report`
(BENCHMARKS.md and plots), ``__main__`` (the command line); for the stress grids :mod:`.stress_run` (their units),
:mod:`.merge_space` (each method's search space), :mod:`.tuning` (selection on validation), :mod:`.scoring`
(per-example correctness), :mod:`.noise_injection`, :mod:`.floor` (gain retained),
:mod:`benchmarks.significance` (paired bootstrap, McNemar) and :mod:`.stress_report` (BENCHMARKS_STRESS.md).
"""
