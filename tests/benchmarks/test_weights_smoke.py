"""Smoke test of the weight benchmark: every row in one run, tiny sizes (``--quick``)."""

from __future__ import annotations

import pytest

from benchmarks.weights import main


def test_weights_bench_quick_prints_every_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick", "--reps", "2", "--no-torchrl"]) == 0
    out = capsys.readouterr().out
    for row in ("asyncrl ZmqWeightSyncScheme (ipc)",
                "asyncrl SharedMemWeightSyncScheme (safe, zero-copy)",
                "asyncrl LiveSharedMemWeightSyncScheme (live, opt-in)",
                "one memcpy of the parameters (limit)",
                "bare pyzmq ROUTER/DEALER", "command: python -m benchmarks.weights --quick"):
        assert row in out, out
