"""Timing scripts, ``python -m benchmarks.speed.<name>``, on one helper (:mod:`.timing`); docs/benchmarks.md."""
