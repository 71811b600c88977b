"""Smoke test of the stepping-worker weight benchmark (tiny model, two updates)."""

from __future__ import annotations

import pytest

from benchmarks.weights_pause import main


def test_weights_pause_prints_both_schemes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--size", "4k", "--updates", "2"]) == 0
    out = capsys.readouterr().out
    for row in ("| ZmqWeightSyncScheme() (receive buffer) |",
                "| ZmqWeightSyncScheme(in_place=True) |",
                "command: python -m benchmarks.weights_pause --size 4k --updates 2"):
        assert row in out, out
