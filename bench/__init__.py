"""Benchmarks: `python -m bench` (or `make bench`) runs them all; see bench/README.md."""
