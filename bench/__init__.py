"""Benchmarks (run as scripts: `.venv/bin/python bench/NAME.py`); `bench.support` is what they
share with the tests."""
