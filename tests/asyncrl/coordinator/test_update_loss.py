"""A worker lost during a weight update is one error whatever the timing (issue #35, item 6).

Under ``on_worker_loss="raise"`` the weight sender's :class:`~transports.PeerLostError`
used to reach the trainer raw when the coordinator had not failed the run within
``peer_timeout + 1`` s, so ``except asyncrl.AsyncRLError`` missed it depending on
timing. Here a coordinator that never fails makes that branch happen every time.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from asyncrl import AsyncRLError, WorkerLostError
from asyncrl._coordinator.loss_policy import LossPolicy
from asyncrl._coordinator.records import WorkerInfo
from asyncrl.collectors.multi.losses import WorkerLosses
from transports import PeerLostError

pytestmark = pytest.mark.anyio


class SilentCoordinator:
    """Hears nothing of the loss: it never fails the run, nobody left."""

    def __init__(self, failure: BaseException | None = None) -> None:
        self.roster = SimpleNamespace(
            workers={b"w1": WorkerInfo(1, b"w1", "host-b-0", "host-b", 4242)})
        self.failure = failure
        self.state = SimpleNamespace(losses=self)

    async def settle(self, peer: bytes, timeout: float) -> None:
        await anyio.lowlevel.checkpoint()

    def raise_if_failed(self) -> None:
        if self.failure is not None:
            raise self.failure

    def has_left(self, peer: bytes) -> bool:
        return False


def losses(on_worker_loss: str, coordinator: Any) -> WorkerLosses:
    run = SimpleNamespace(coordinator=coordinator, config=SimpleNamespace(
        peer_timeout=0.05,
        coordinator=SimpleNamespace(loss_policy=LossPolicy.check(on_worker_loss))))
    return WorkerLosses(run)  # type: ignore[arg-type]


async def test_a_loss_the_coordinator_has_not_named_is_still_a_worker_lost_error() -> None:
    lost = PeerLostError([b"w1", b"stranger"], "before it acknowledged weights")
    with anyio.fail_after(10), pytest.raises(WorkerLostError) as caught:
        await losses("raise", SilentCoordinator()).during_update(lost)
    assert isinstance(caught.value, AsyncRLError)
    assert caught.value.__cause__ is lost
    message = str(caught.value)
    assert "worker 1 (host-b-0, pid 4242 on host-b)" in message, message
    assert "peer stranger" in message and "while weights were sent" in message, message
    assert "on_worker_loss='continue'" in message, message


async def test_the_coordinators_own_error_wins_when_it_came_first() -> None:
    named = WorkerLostError("worker 1 (host-b-0, pid 4242 on host-b) stopped answering")
    with anyio.fail_after(10), pytest.raises(WorkerLostError) as caught:
        await losses("raise", SilentCoordinator(named)).during_update(PeerLostError([b"w1"]))
    assert caught.value is named


@pytest.mark.parametrize("word", ["continue", "wait", "restart"])
async def test_other_modes_carry_on_without_the_lost_worker(word: str) -> None:
    with anyio.fail_after(10):
        await losses(word, SilentCoordinator()).during_update(PeerLostError([b"w1"]))
