"""The benchmark suite of issue #8: ``python -m bench`` (see bench/cli.py and docs/benchmarks.md)."""
