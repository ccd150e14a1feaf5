"""Benchmark scripts of the current library, run as modules from the repository root
(``python -m speed.bench_chains``); their figures are in ``BENCHMARKS.md``."""
