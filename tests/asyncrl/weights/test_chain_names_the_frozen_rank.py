"""A chain's broken link names the rank at its other end (issue #35, item 6).

A frozen middle rank used to surface as the healthy downstream rank's own
timeout; now each end of a failed link names the rank it waited for. A fake
process group makes the timeout happen deterministically (no gloo, no process).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from asyncrl.weights import WeightSyncError
from asyncrl.weights._collective import Group


class Work:
    def __init__(self, fails: bool) -> None:
        self.fails = fails

    def wait(self, timeout: Any = None) -> None:
        if self.fails:
            raise RuntimeError("[gloo] Timed out waiting 3000ms for recv operation to complete")


class FrozenNeighbour:
    """Receives time out (the previous rank is frozen), or sends do (the next one is)."""

    def __init__(self, *, recv_fails: bool = False, send_fails: bool = False) -> None:
        self.recv_fails, self.send_fails = recv_fails, send_fails

    def recv(self, tensors: Any, rank: int, tag: int) -> Work:
        return Work(self.recv_fails)

    def send(self, tensors: Any, rank: int, tag: int) -> Work:
        return Work(self.send_fails)


def group(pg: FrozenNeighbour, rank: int) -> Group:
    return Group(pg, rank, 4, "gloo", 3.0, None, algorithm="chain", chunk_bytes=4096)


def test_a_rank_that_sends_nothing_is_named_by_the_rank_after_it() -> None:
    with pytest.raises(WeightSyncError) as caught:
        group(FrozenNeighbour(recv_fails=True), rank=2).broadcast(torch.zeros(10_000))
    message = str(caught.value)
    assert "receiving from rank 1 (worker 0) failed within 3.0 s" in message, message
    assert "rank 1 is frozen or dead" in message and "Timed out" in message, message
    assert isinstance(caught.value.__cause__, RuntimeError)


def test_a_rank_that_takes_nothing_is_named_by_the_rank_before_it() -> None:
    with pytest.raises(WeightSyncError) as caught:
        group(FrozenNeighbour(send_fails=True), rank=0).broadcast(torch.zeros(10_000))
    assert "sending to rank 1 (worker 0)" in str(caught.value), caught.value


def test_a_healthy_chain_is_untouched() -> None:
    buffer = torch.zeros(10_000)
    group(FrozenNeighbour(), rank=3).broadcast(buffer)  # the last rank: receives only
