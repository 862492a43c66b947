"""Benchmarks: ``python -m bench [scenario ...]`` prints a table and writes bench/results/*.json."""
