"""Newest wins in the trainer's memory, and snapshots staged in reused buffers.

Each worker has at most one weight message in transit (handed to the hub, not
acknowledged) and one version queued in the sender; a newer send replaces the
queued one, which is never transmitted. Over the in-memory transport with the
real codec: a decoded message shares the sender's memory, as over ZeroMQ, so
a buffer reused too early shows up as wrong weights on the worker.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import torch
from torch import nn

from asyncrl import AsyncRLError
from asyncrl._protocol import RELAY_TO, RelayAck
from asyncrl.testing import fill_parameters, parameter_values
from asyncrl.weights import (
    SharedMemWeightSyncScheme,
    WeightReceiver,
    WeightSender,
    ZmqWeightSyncScheme,
)
from transports import LocalHub, LocalLink, PeerLostError, RemoteError, Ticket

pytestmark = pytest.mark.anyio
WAIT = 30
SENDS = 50


def net(fill: float) -> nn.Module:
    module = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    fill_parameters(module, fill)
    return module




class CountingHub(LocalHub):
    """A LocalHub (real codec) that records every weight message handed to it."""

    def __init__(self) -> None:
        super().__init__(encode=True)
        self.sent: list[tuple[frozenset[bytes], int, Any]] = []  # (peers, version, body)

    async def send_async(self, peers: Any, body: Any, *, kind: str = "data",
                         meta: dict[str, Any] | None = None) -> Ticket:
        peers = frozenset(peers)
        self.sent.append((peers, (meta or {}).get("version", 0), body))
        return await super().send_async(peers, body, kind=kind, meta=meta)

    def to(self, peer: bytes) -> list[int]:
        return [version for peers, version, _ in self.sent if peer in peers]


class Worker:
    """Receives, applies and acks when told to (``serve``); holds its messages until then."""

    def __init__(self, hub: LocalHub, index: int) -> None:
        # Not "worker-N": a lost send must name the identity the hub knows it by
        self.peer = f"host-a-w{index}".encode()
        self.link: LocalLink = hub.connect(self.peer)
        self.model = net(0.0)
        self.receiver = WeightReceiver("policy", self.model)
        self.seen: list[tuple[int, set[float]]] = []  # (version, values) of each message

    async def serve(self) -> None:
        while True:
            message = await self.link.recv()
            body = message.body
            self.seen.append((message.meta["version"],
                              {float(v) for t in body.values(True, True) for v in t.reshape(-1)}))
            self.receiver.on_message(message)
            self.receiver.apply_pending()
            await self.receiver.flush_acks(self.link)


@asynccontextmanager
async def trainer(workers: int = 2) -> AsyncIterator[tuple[CountingHub, WeightSender,
                                                            list[Worker], nn.Module]]:
    hub = CountingHub()
    model = net(0.0)
    group = [Worker(hub, i) for i in range(workers)]
    scheme = ZmqWeightSyncScheme()
    sender = scheme.init_on_sender("policy", hub=hub, model=model,
                                   workers={i: w.peer for i, w in enumerate(group)})
    try:
        yield hub, sender, group, model
    finally:
        await scheme.aclose()


async def rapid_sends(sender: WeightSender, model: nn.Module, count: int = SENDS) -> None:
    for version in range(1, count + 1):
        fill_parameters(model, float(version))  # version k's weights are all k
        assert await sender.send_async() == version


async def test_rapid_sends_to_a_worker_not_reading_transmit_a_bounded_number() -> None:
    with anyio.fail_after(WAIT):
        async with trainer() as (hub, sender, workers, model), \
                anyio.create_task_group() as tg:
            tg.start_soon(workers[0].serve)  # worker 0 keeps up, worker 1 reads nothing yet
            await rapid_sends(sender, model)
            assert hub.to(workers[1].peer) == [1]  # in transit; 50 queued, 2..49 dropped
            assert len({id(body) for _, _, body in hub.sent}) <= 3  # snapshot buffers reused
            tg.start_soon(workers[1].serve)
            assert await sender.wait_ack(timeout=WAIT) == {0: SENDS, 1: SENDS}
            assert hub.to(workers[1].peer) == [1, SENDS]
            for worker in workers:
                assert worker.receiver.version == SENDS
                assert parameter_values(worker.model) == {float(SENDS)}
                # each message held exactly its version's weights: no buffer was
                # rewritten while a message still referred to it
                assert all(seen == {float(version)} for version, seen in worker.seen)
            assert sender.outstanding == 0
            tg.cancel_scope.cancel()


async def test_a_superseded_send_reports_the_failure_of_the_version_that_replaced_it() -> None:
    with anyio.fail_after(WAIT):
        async with trainer(1) as (hub, sender, workers, model):
            worker = workers[0]
            await rapid_sends(sender, model, 3)  # 1 in transit, 3 queued (2 replaced)
            first = await worker.link.recv()
            await worker.link.ack(first, {"model_id": "policy", "version": 1})
            async with anyio.create_task_group() as tg:
                @tg.start_soon
                async def refuse() -> None:
                    message = await worker.link.recv()
                    assert message.meta["version"] == 3
                    await worker.link.ack(message, error=RuntimeError("cannot apply"))

                with pytest.raises(RemoteError, match="cannot apply") as info:
                    await sender.wait_ack(timeout=WAIT)
            assert hub.to(worker.peer) == [1, 3]
            # a user catching asyncrl's tree catches it (and transports' still does)
            assert isinstance(info.value, AsyncRLError) and type(info.value).__module__ == \
                "asyncrl._errors"
            # the oldest failed send is the one reported: 2, answered by 3's failure
            assert "version 2 of model 'policy'" in "".join(info.value.__notes__)
            assert sender.outstanding == 0


async def test_a_worker_lost_or_removed_while_queued_fails_its_sends_without_hanging() -> None:
    with anyio.fail_after(WAIT):
        async with trainer() as (hub, sender, workers, model):
            await rapid_sends(sender, model, 3)
            hub.lose(workers[0].peer)  # version 1 never acked; 3 goes out to nobody
            sender.remove_worker(1)  # version 3 never sent to it
            with pytest.raises(PeerLostError) as lost:
                await sender.wait_ack(timeout=WAIT)
            assert isinstance(lost.value, AsyncRLError)
            assert sender.outstanding == 0
            assert hub.to(workers[1].peer) == [1]


async def test_a_send_queued_for_a_removed_worker_names_it_by_its_identity() -> None:
    # The run tells a departure (no failure, whatever on_worker_loss) from a loss by the
    # worker's hub identity: a send that never went out must name it so, not by a made-up
    # "worker-1" (a chaos run saw a clean departure fail the run under "raise" that way).
    with anyio.fail_after(WAIT):
        async with trainer() as (_hub, sender, workers, model), \
                anyio.create_task_group() as tg:
            tg.start_soon(workers[0].serve)  # worker 0 keeps up, worker 1 reads nothing
            await rapid_sends(sender, model, 3)  # worker 1: version 1 in transit, 3 queued
            third = [s for s in sender._outstanding if s.version == 3]
            sender.remove_worker(1)
            never_sent = [p for s in third for p in s.parts if p.ticket.seq == 0]
            assert [dict(p.workers) for p in never_sent] == [{workers[1].peer: 1}]
            with pytest.raises(PeerLostError) as info:
                await sender.wait_ack(timeout=WAIT)
            assert info.value.peers == [workers[1].peer]
            tg.cancel_scope.cancel()


async def test_a_send_queued_for_a_worker_the_scheduler_dropped_names_it_too() -> None:
    # The run's scheduler gives the workers as a callable and simply forgets one that
    # left (no remove_worker): the send queued for it still names its identity.
    hub, model = CountingHub(), net(0.0)
    group = [Worker(hub, i) for i in range(2)]
    live = {i: w.peer for i, w in enumerate(group)}
    scheme = ZmqWeightSyncScheme()
    sender = scheme.init_on_sender("policy", hub=hub, model=model, workers=lambda: live)
    try:
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(group[0].serve)
                await rapid_sends(sender, model, 3)  # worker 1: version 1 in transit, 3 queued
                del live[1]  # it left; its ack of version 1 comes after
                first = await group[1].link.recv()
                await group[1].link.ack(first, {"model_id": "policy", "version": 1})
                with pytest.raises(PeerLostError) as info:
                    await sender.wait_ack(timeout=WAIT)
                assert info.value.peers == [group[1].peer]
                assert hub.to(group[1].peer) == [1]  # version 3 never went out to it
                tg.cancel_scope.cancel()
    finally:
        await scheme.aclose()


async def test_relayed_workers_get_one_message_in_transit_per_relay() -> None:
    with anyio.fail_after(WAIT):
        async with trainer() as (hub, sender, workers, model):
            relay = hub.connect(b"relay")
            sender.set_relay_routes(lambda: {0: b"relay", 1: b"relay"})
            await rapid_sends(sender, model)
            assert hub.to(b"relay") == [1]

            async with anyio.create_task_group() as tg:
                @tg.start_soon
                async def fan_out() -> None:
                    for _ in range(2):
                        message = await relay.recv()
                        assert sorted(message.meta[RELAY_TO]) == [w.peer for w in workers]
                        version = message.meta["version"]
                        await relay.ack(message, RelayAck(
                            "policy", {w.peer: version for w in workers}, {}).to_body())

                assert await sender.wait_ack(timeout=WAIT) == {0: SENDS, 1: SENDS}
            assert hub.to(b"relay") == [1, SENDS]
            assert sender.copies_sent == 2


async def test_a_staged_buffer_is_not_rewritten_while_its_message_is_in_transit() -> None:
    with anyio.fail_after(WAIT):
        async with trainer(1) as (hub, sender, workers, model):
            worker = workers[0]
            for version in (1, 2, 3):
                fill_parameters(model, float(version))
                await sender.send_async()
            first = await worker.link.recv()  # still version 1's memory, after two more sends
            assert {float(v) for t in first.body.values(True, True)
                    for v in t.reshape(-1)} == {1.0}
            assert sender.version == 3 and hub.to(worker.peer) == [1]
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.serve)
                worker.receiver.on_message(first)
                worker.receiver.apply_pending()
                await worker.receiver.flush_acks(worker.link)
                assert await sender.wait_ack(timeout=WAIT) == {0: 3}
                tg.cancel_scope.cancel()
            assert worker.seen == [(3, {3.0})]


async def test_acked_sends_alternate_between_two_snapshot_buffers() -> None:
    with anyio.fail_after(WAIT):
        async with trainer() as (hub, sender, workers, model), \
                anyio.create_task_group() as tg:
            for worker in workers:
                tg.start_soon(worker.serve)
            for version in range(1, 11):
                fill_parameters(model, float(version))
                assert await sender.send(timeout=WAIT) == version
            bodies = [body for _, _, body in hub.sent]
            assert len(bodies) == 10 and len({id(body) for body in bodies}) == 2
            for worker in workers:
                assert [version for version, _ in worker.seen] == list(range(1, 11))
                assert all(seen == {float(version)} for version, seen in worker.seen)
            tg.cancel_scope.cancel()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("scheme_cls", [ZmqWeightSyncScheme, SharedMemWeightSyncScheme])
async def test_cuda_weights_are_staged_through_reused_pinned_buffers(scheme_cls: Any) -> None:
    with anyio.fail_after(WAIT):
        hub = CountingHub()
        worker = Worker(hub, 0)
        model = net(0.0).cuda()
        scheme = scheme_cls()
        sender = scheme.init_on_sender("policy", hub=hub, model=model, workers={0: worker.peer})
        receiver = scheme.init_on_worker("policy", model=worker.model)
        try:
            async with anyio.create_task_group() as tg:
                @tg.start_soon
                async def serve() -> None:
                    while True:
                        message = await worker.link.recv()
                        receiver.on_message(message)
                        receiver.apply_pending()
                        await receiver.flush_acks(worker.link)

                for version in range(1, 6):
                    fill_parameters(model, float(version))
                    assert await sender.send(timeout=WAIT) == version
                    assert parameter_values(worker.model) == {float(version)}
                tg.cancel_scope.cancel()
            if scheme_cls is ZmqWeightSyncScheme:
                bodies = [body for _, _, body in hub.sent]
                assert len({id(body) for body in bodies}) <= 2  # two buffers, alternating
                assert all(t.device.type == "cpu" and t.is_pinned()
                           for t in bodies[0].values(True, True))
        finally:
            await scheme.aclose()




async def test_a_queued_version_goes_out_by_itself_once_the_one_ahead_is_acked() -> None:
    # No later send_async or wait_ack: run() (which the collectors start) sends it.
    with anyio.fail_after(WAIT):
        async with trainer(1) as (hub, sender, workers, model), \
                anyio.create_task_group() as tg:
            tg.start_soon(sender.run)
            await rapid_sends(sender, model, 3)  # 1 in transit, 3 queued
            assert hub.to(workers[0].peer) == [1]
            tg.start_soon(workers[0].serve)  # acks 1: 3 must follow with nobody asking
            while workers[0].receiver.version != 3:
                await anyio.sleep(0.01)
            assert hub.to(workers[0].peer) == [1, 3]
            assert parameter_values(workers[0].model) == {3.0}
            tg.cancel_scope.cancel()
