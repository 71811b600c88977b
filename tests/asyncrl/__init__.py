"""Tests of the asyncrl package (runtime, collectors, weights)."""
