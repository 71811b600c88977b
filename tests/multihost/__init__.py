"""Helpers of the multi-host tests (run in subprocesses or imported)."""
