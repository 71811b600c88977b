"""Smoke test of the relay benchmark's weight path (tiny model, 1 worker process + relay)."""

from __future__ import annotations

import anyio

from benchmarks.relay import bench_weights


def test_relay_bench_weights_one_copy_per_version_through_the_relay(tmp_path) -> None:
    rows = anyio.run(bench_weights, {"4k": ((32, 64, 32, 4), 2)}, str(tmp_path), None, 1)
    row = rows["4k"]
    assert len(row.times["direct"]) == len(row.times["relay"]) == 2
    assert row.copies == {"direct": 2, "relay": 2}  # one copy per version either way
