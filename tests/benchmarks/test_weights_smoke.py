"""Smoke test of the weight benchmark: every row in one run, tiny sizes (``--quick``)."""

from __future__ import annotations

import pytest

from benchmarks.weights import main


def test_weights_bench_quick_prints_every_row(capsys: pytest.CaptureFixture[str]) -> None:
    # the bandwidth rows: the next test (the slower half of a whole --quick run)
    assert main(["--quick", "--reps", "2", "--no-torchrl", "--no-bandwidth"]) == 0
    out = capsys.readouterr().out
    for row in ("asyncrl ZmqWeightSyncScheme (ipc)",
                "asyncrl SharedMemWeightSyncScheme (safe, zero-copy)",
                "asyncrl LiveSharedMemWeightSyncScheme (live, opt-in)",
                "one memcpy of the parameters (limit)",
                "command: python -m benchmarks.weights --quick"):
        assert row in out, out


def test_weights_bench_bandwidth_only_streams_in_chunks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick", "--reps", "1", "--bandwidth-only", "--chunk-bytes", "1000000"]) == 0
    out = capsys.readouterr().out
    for row in ("bare pyzmq ROUTER/DEALER, one message",
                "bare pyzmq ROUTER/DEALER, 0.953674 MiB messages",
                "asyncrl ZmqWeightSyncScheme(chunk_bytes=0.953674 MiB)",
                "asyncrl ZmqWeightSyncScheme(chunk_bytes=0.953674 MiB, in_place=True)",
                "asyncrl ZmqWeightSyncScheme(chunk_bytes=0) (one message, as before)",
                "| worker RSS after (MB) |"):
        assert row in out, out
    assert "asyncrl ZmqWeightSyncScheme (ipc)" not in out  # no latency rows
