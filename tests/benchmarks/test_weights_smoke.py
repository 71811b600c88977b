"""Smoke test of the weight benchmark: every row in one run, tiny sizes (``--quick``)."""

from __future__ import annotations

import os
import shutil
import subprocess

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
                "bare pyzmq ROUTER/DEALER, 0.953674 MiB messages, each copied into a buffer",
                "| / bare, same chunks copied |",
                "asyncrl ZmqWeightSyncScheme(chunk_bytes=0.953674 MiB)",
                "asyncrl ZmqWeightSyncScheme(chunk_bytes=0.953674 MiB, in_place=True)",
                "asyncrl ZmqWeightSyncScheme(chunk_bytes=0) (one message, as before)",
                "| worker RSS after (MB) |"):
        assert row in out, out
    assert "asyncrl ZmqWeightSyncScheme (ipc)" not in out  # no latency rows


def test_weights_bench_across_a_shaped_link_leaves_no_namespace(
        capsys: pytest.CaptureFixture[str]) -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.skip("--link needs root, iproute2 and tc to create a network namespace")
    before = _namespaces()
    assert main(["--quick", "--reps", "1", "--bandwidth-only", "--chunk-bytes", "1000000",
                 "--link", "1gbit"]) == 0
    out = capsys.readouterr().out
    assert ("Bandwidth over tcp across a veth pair into a network namespace, shaped to "
            "1gbit each way (tbf)") in out, out
    assert "asyncrl ZmqWeightSyncScheme(chunk_bytes=0.953674 MiB) send + apply + ack" in out
    assert _namespaces() == before  # the namespace and its veth pair are gone


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}
