"""Benchmarks for edgeserve (run with `make bench`); not part of the test suite."""
