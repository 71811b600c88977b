"""Benchmarks: ``python -m asyncrl.bench.<name>`` prints a Markdown table and its command."""
