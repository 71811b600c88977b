"""Smoke test of benchmarks/compact_obs.py: its byte count, and one tiny collector window."""

from __future__ import annotations

import pytest

from benchmarks import compact_obs


def test_the_pixel_batch_crosses_the_wire_with_about_one_observation_per_frame() -> None:
    wire = compact_obs.wire_bytes()
    assert wire["observation"] == 4 * 84 * 84
    assert wire["full"] > 2 * wire["observation"]  # obs and ("next", obs): both shipped
    assert wire["observation"] < wire["compact"] < 1.05 * wire["observation"]


@pytest.mark.slow
def test_a_collector_window_reports_frames_and_cpu() -> None:
    result = compact_obs.run_collector("async", batches=1)
    assert result["fps"] > 0 and result["cpu_per_10k"] > 0
