"""Launchers that start asyncrl workers on clusters; they connect back over ZeroMQ."""
