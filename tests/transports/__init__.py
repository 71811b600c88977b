"""Tests of the transports package (wire layer)."""
