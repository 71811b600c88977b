"""Observation: events, statistics, latency histograms and the progress bar."""
