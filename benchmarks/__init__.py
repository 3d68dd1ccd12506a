"""The project's benchmarks, run from the repository root: ``python -m benchmarks.quality``,
``python benchmarks/merge.py``, ``python benchmarks/train_step.py``."""
