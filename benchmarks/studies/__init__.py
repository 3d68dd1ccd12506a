"""Benchmark studies on the one harness (:mod:`benchmarks.harness`), one module each."""
