"""The weight applier alone: over the in-memory hub, with a fake rollout, no sockets.

A worker's (and the in-process collector's) weight dance: an update is
applied at once while the model is idle, else between two steps (the
rollout's ``before_step`` hook, in the rollout thread) or after a batch;
newest wins; every message is acked with the version applied, over the
route it came by (the coordinator directly, or the host's relay).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anyio
import pytest
import torch
from torch import nn

from asyncrl.weights import (
    AckRoute,
    NoWeightSyncScheme,
    StreamedWeightReceiver,
    WeightApplier,
    WeightMismatchError,
    WeightReceiver,
    ZmqWeightSyncScheme,
)
from transports import LocalHub, LocalLink, Message, ProtocolError, RemoteError, Ticket

pytestmark = pytest.mark.anyio
WAIT = 10
PEER = b"w0"


def weights(value: float) -> dict[str, torch.Tensor]:
    return {"weight": torch.full((1, 2), value), "bias": torch.zeros(1)}


def model_value(model: nn.Linear) -> float:
    return float(model.weight.detach()[0, 0])


class CountingReceiver(WeightReceiver):
    """Records each version it copies into the model."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.applied: list[int] = []

    def _apply(self, update: Any) -> int:
        version = super()._apply(update)
        self.applied.append(version)
        return version


class FakeRollout:
    """What the applier drives: a step hook and the version stamped on frames."""

    def __init__(self) -> None:
        self.before_step: Any = None
        self.policy_version = 0

    def step_boundary(self) -> None:  # in the rollout thread, between two steps
        if self.before_step is not None:
            self.before_step()


class Worker:
    """A worker's weight side: a link to the coordinator, one to the relay, an applier."""

    def __init__(self, *, busy: bool = False) -> None:
        self.coordinator, self.relay = LocalHub(encode=True), LocalHub(encode=True)
        self.busy = busy
        self.model = nn.Linear(2, 1)
        self.receiver = CountingReceiver("policy", self.model)
        direct = self.coordinator.connect(PEER, deliver=lambda m: self.applier.deliver(m))
        relay = self.relay.connect(
            PEER, deliver=lambda m: self.applier.deliver(m, AckRoute.RELAY))
        self.applier = WeightApplier(direct, relay=relay, busy=lambda: self.busy)
        self.applier.add(self.receiver)
        self.rollout = FakeRollout()
        self.applier.attach(self.rollout)

    async def send(self, hub: LocalHub, version: int, body: Any = None,
                   **meta: Any) -> Ticket:
        body = weights(float(version)) if body is None else body
        return await hub.send_async([PEER], body, kind="weights",
                                    meta={"model_id": "policy", "version": version, **meta})

    async def step_boundary(self) -> None:
        await anyio.to_thread.run_sync(self.rollout.step_boundary)


async def acked(hub: LocalHub, ticket: Ticket) -> Any:
    return (await hub.wait_ack(ticket, timeout=WAIT))[PEER]


async def test_an_update_that_comes_during_a_batch_waits_for_the_next_step_boundary() -> None:
    worker = Worker(busy=True)
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.applier.send_acks)
            ticket = await worker.send(worker.coordinator, 1)
            await anyio.wait_all_tasks_blocked()
            # Inside a step: nothing applied, nothing acked, the frames keep version 0.
            assert worker.receiver.applied == []
            assert worker.rollout.policy_version == 0 and ticket.pending == {PEER}
            await worker.step_boundary()
            assert worker.receiver.applied == [1] and model_value(worker.model) == 1.0
            assert worker.rollout.policy_version == worker.applier.policy_version == 1
            assert await acked(worker.coordinator, ticket) == {"model_id": "policy",
                                                               "version": 1}
            worker.applier.close()


async def test_an_update_that_comes_while_idle_is_applied_at_once() -> None:
    worker = Worker(busy=False)
    with anyio.fail_after(WAIT):
        ticket = await worker.send(worker.coordinator, 1)
        assert worker.receiver.applied == [1] and worker.rollout.policy_version == 1
        assert await worker.applier.flush_acks() == 1
        assert await acked(worker.coordinator, ticket) == {"model_id": "policy", "version": 1}


async def test_newest_wins_and_both_messages_are_acked_with_it() -> None:
    worker = Worker(busy=True)
    with anyio.fail_after(WAIT):
        first = await worker.send(worker.coordinator, 1)
        second = await worker.send(worker.coordinator, 2)
        await worker.step_boundary()
        assert worker.receiver.applied == [2], "version 1 was copied in for nothing"
        assert model_value(worker.model) == 2.0 and worker.rollout.policy_version == 2
        assert await worker.applier.flush_acks() == 2
        for ticket in (first, second):
            assert await acked(worker.coordinator, ticket) == {"model_id": "policy",
                                                               "version": 2}


async def test_what_came_after_the_last_step_is_applied_after_the_batch() -> None:
    worker = Worker(busy=True)
    with anyio.fail_after(WAIT):
        ticket = await worker.send(worker.coordinator, 1)
        worker.busy = False  # the batch ended
        worker.applier.after_batch()
        assert worker.receiver.applied == [1] and worker.rollout.policy_version == 1
        await worker.applier.flush_acks()
        assert await acked(worker.coordinator, ticket) == {"model_id": "policy", "version": 1}


async def test_each_ack_goes_back_the_way_its_message_came() -> None:
    worker = Worker(busy=False)
    with anyio.fail_after(WAIT):
        # Both hubs number their messages from 1: an ack on the wrong link would
        # resolve the other hub's ticket with the wrong version.
        relayed = await worker.send(worker.relay, 1)
        direct = await worker.send(worker.coordinator, 2)
        assert (relayed.seq, direct.seq) == (1, 1)
        assert await worker.applier.flush_acks() == 2
        assert await acked(worker.relay, relayed) == {"model_id": "policy", "version": 1}
        assert await acked(worker.coordinator, direct) == {"model_id": "policy", "version": 2}


async def test_newest_wins_across_routes_and_each_ack_keeps_its_route() -> None:
    worker = Worker(busy=True)
    with anyio.fail_after(WAIT):
        relayed = await worker.send(worker.relay, 1)
        direct = await worker.send(worker.coordinator, 2)
        await worker.step_boundary()
        assert worker.receiver.applied == [2]
        acks = worker.applier.receivers.take_acks()
        assert [(a.message.seq, a.version, a.route) for a in acks] == [
            (1, 2, AckRoute.RELAY), (1, 2, AckRoute.DIRECT)]
        assert (relayed.pending, direct.pending) == ({PEER}, {PEER})


async def test_a_failing_load_is_acked_as_an_error() -> None:
    worker = Worker(busy=False)
    with anyio.fail_after(WAIT):
        bad_body = await worker.send(worker.coordinator, 1, body=[1, 2, 3])
        wrong_shape = await worker.send(worker.relay, 2, body={"weight": torch.ones(3, 3),
                                                              "bias": torch.zeros(1)})
        assert await worker.applier.flush_acks() == 2
        with pytest.raises(RemoteError) as info:
            await worker.coordinator.wait_ack(bad_body, timeout=WAIT)
        assert info.value.remote_type == f"{ProtocolError.__module__}.ProtocolError"
        with pytest.raises(RemoteError) as info:
            await worker.relay.wait_ack(wrong_shape, timeout=WAIT)
        assert info.value.remote_type.endswith(WeightMismatchError.__qualname__)
        assert worker.receiver.version == 0 and worker.rollout.policy_version == 0
        assert isinstance(worker.receiver.last_error, WeightMismatchError)


async def test_an_unknown_model_id_is_acked_as_an_error() -> None:
    worker = Worker(busy=False)
    with anyio.fail_after(WAIT):
        ticket = await worker.coordinator.send_async(
            [PEER], weights(1.0), kind="weights", meta={"model_id": "critic", "version": 1})
        await worker.applier.flush_acks()
        with pytest.raises(RemoteError, match="no weight receiver for model 'critic'"):
            await worker.coordinator.wait_ack(ticket, timeout=WAIT)


async def test_direct_acks_of_another_coordinator_instance_are_dropped() -> None:
    # A restarted coordinator numbers its messages afresh: an ack of what the dead
    # one sent would name another message there. A relay drops such acks itself.
    worker = Worker(busy=False)
    worker.applier.follow("new")
    with anyio.fail_after(WAIT):
        stale = await worker.send(worker.coordinator, 1, instance="old")
        relayed = await worker.send(worker.relay, 1, instance="old")
        current = await worker.send(worker.coordinator, 2, instance="new")
        assert await worker.applier.flush_acks() == 2  # the relayed error and version 2
        assert stale.pending == {PEER}
        with pytest.raises(RemoteError, match="stale"):
            await worker.relay.wait_ack(relayed, timeout=WAIT)
        assert await acked(worker.coordinator, current) == {"model_id": "policy", "version": 2}


async def test_an_interrupted_flush_keeps_the_unsent_acks() -> None:
    worker = Worker(busy=True)
    with anyio.fail_after(WAIT):
        tickets = [await worker.send(worker.coordinator, v) for v in (1, 2)]
        await worker.step_boundary()
        direct = worker.applier._links[AckRoute.DIRECT]
        assert isinstance(direct, LocalLink)
        calls = 0

        async def fail_once(message: Message, result: Any = None, *,
                            error: BaseException | None = None) -> None:
            nonlocal calls
            calls += 1
            if calls == 2:
                raise ConnectionError("cut")
            await LocalLink.ack(direct, message, result, error=error)

        direct.ack = fail_once  # type: ignore[method-assign]
        with pytest.raises(ConnectionError):
            await worker.applier.flush_acks()
        assert await worker.applier.flush_acks() == 1  # the second, not sent twice
        for ticket in tickets:
            assert (await acked(worker.coordinator, ticket))["version"] == 2


async def test_weights_by_a_route_without_a_link_are_refused_loudly() -> None:
    applier = WeightApplier(LocalHub().connect(PEER))
    message = Message(b"", "weights", 1, weights(1.0), {"model_id": "policy", "version": 1},
                      True)
    with pytest.raises(ValueError, match="no link to ack them over"):
        applier.deliver(message, AckRoute.RELAY)


async def test_send_acks_ends_when_closed_and_without_receivers_no_hook_is_set() -> None:
    applier = WeightApplier(LocalHub().connect(PEER))
    rollout = FakeRollout()
    applier.attach(rollout)
    assert rollout.before_step is None  # the hot loop keeps its no-hook fast path
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(applier.send_acks)
            await anyio.wait_all_tasks_blocked()
            applier.close()
            applier.close()


async def test_receivers_come_from_the_spec_and_the_coordinator_without_duplicates() -> None:
    worker = SimpleNamespace(policy=nn.Linear(2, 1), critic=nn.Linear(2, 1))
    applier = WeightApplier(LocalHub().connect(PEER))
    applier.add_schemes({"policy": ZmqWeightSyncScheme()}, root=worker)
    applier.add_configs({"policy": NoWeightSyncScheme().to_config(),  # ours is kept
                         "critic": ZmqWeightSyncScheme().to_config()}, root=worker)
    assert applier.receivers.versions == {"policy": 0, "critic": 0}
    assert type(applier.receivers["policy"]) is StreamedWeightReceiver  # the Zmq scheme's


async def test_a_model_this_worker_lacks_is_refused_unless_its_weights_never_come() -> None:
    random_worker = SimpleNamespace(policy=None, critic=None)  # no policy: random actions
    applier = WeightApplier(LocalHub().connect(PEER))
    applier.add_configs({"policy": NoWeightSyncScheme().to_config()}, root=random_worker)
    with pytest.raises(ValueError, match="syncs the weights of 'critic', but this worker has no"):
        applier.add_configs({"critic": ZmqWeightSyncScheme().to_config()}, root=random_worker)
