"""Tests of the benchmarks (run from a checkout: ``benchmarks`` is not installed)."""
