"""`python -m bench`: the benchmark suite of issue 7, run on the real stack (docs/benchmarks.md)."""
