"""The project's benchmarks, run from the repository root: the studies, ``python -m benchmarks.studies.<name>``
(:mod:`benchmarks.harness`), and the timing scripts, ``python -m benchmarks.speed.<name>``."""
