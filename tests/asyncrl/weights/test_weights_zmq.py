"""Weight sync over real ZeroMQ sockets (Hub and Link), in tasks and in a worker process.

The process test is the shared-memory torn-read test at the scheme level: the
trainer hammers versions (every parameter filled with the version number)
without waiting for a buffer to free up (``slot_timeout=0``: the pool grows
instead) while the worker applies each as it arrives (zero-copy: its
parameters view the buffer) and checks that the model holds exactly one version.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from torch import nn

from asyncrl.testing import fill_parameters, parameter_values
from asyncrl.weights import (
    SharedMemWeightSyncScheme,
    WeightReceiverGroup,
    WeightSender,
    WeightSyncScheme,
    ZmqWeightSyncScheme,
)
from transports import Hub, Link, Message, PeerEvent, PeerLostError, RemoteError

pytestmark = pytest.mark.anyio
#: Heartbeats that tolerate a loaded CI machine; no test waits for a peer timeout.
LIVENESS = {"heartbeat_interval": 0.1, "peer_timeout": 5.0}
WAIT = 20
SCHEMES = [ZmqWeightSyncScheme, SharedMemWeightSyncScheme]


def net(fill: float, width: int = 8) -> nn.Module:
    module = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))
    fill_parameters(module, fill)
    return module




class TaskWorker:
    """A worker's weight path in a task: Link, receivers, apply on arrival (idle worker)."""

    def __init__(self, endpoint: str, index: int, model: nn.Module,
                 scheme: WeightSyncScheme) -> None:
        self.endpoint = endpoint
        self.peer = f"worker-{index}".encode()
        self.model = model
        self.group = WeightReceiverGroup([scheme.init_on_worker("policy", model=model)])
        self.paused = False
        self.stopped = anyio.Event()
        self.link: Link

    async def run(self) -> None:
        try:
            async with Link(self.endpoint, identity=self.peer, **LIVENESS) as link:
                self.link = link
                await link.send({"hello": True}, kind="hello")
                while True:
                    message = await link.recv()
                    self.group.on_message(message)
                    if not self.paused:
                        self.group.apply_pending()
                        await self.group.flush_acks(link)
        finally:
            await self.group.aclose()
            self.stopped.set()


async def serve_hub(hub: Hub, joined: dict[bytes, anyio.Event]) -> None:
    """Consume the hub's items (acks are handled by the hub itself)."""
    while True:
        item = await hub.recv()
        if isinstance(item, PeerEvent) and item.event == "joined" and item.peer in joined:
            joined[item.peer].set()


@asynccontextmanager
async def running(scheme: WeightSyncScheme, n: int, *, endpoint: str = "tcp://127.0.0.1:0",
                  make_model: Callable[[int], nn.Module] = lambda i: net(0.0)
                  ) -> AsyncIterator[tuple[WeightSender, list[TaskWorker], nn.Module,
                                           dict[int, anyio.CancelScope]]]:
    trainer = net(1.0)
    async with Hub(endpoint, **LIVENESS) as hub, anyio.create_task_group() as tg:
        workers = [TaskWorker(hub.endpoint, i, make_model(i), pickle.loads(pickle.dumps(scheme)))
                   for i in range(n)]
        joined = {w.peer: anyio.Event() for w in workers}
        tg.start_soon(serve_hub, hub, joined)
        scopes: dict[int, anyio.CancelScope] = {}
        for i, worker in enumerate(workers):
            scopes[i] = anyio.CancelScope()
            tg.start_soon(_scoped, scopes[i], worker.run)
        for event in joined.values():
            await event.wait()
        sender = scheme.init_on_sender("policy", hub=hub, model=trainer,
                                       workers={i: w.peer for i, w in enumerate(workers)})
        try:
            yield sender, workers, trainer, scopes
        finally:
            await scheme.aclose()
            tg.cancel_scope.cancel()


async def _scoped(scope: anyio.CancelScope, fn: Callable[[], Any]) -> None:
    with scope:
        await fn()


@pytest.mark.parametrize("scheme_cls", SCHEMES)
@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:0", "inproc://weights-test"])
async def test_send_reaches_every_worker_over_sockets(scheme_cls: type[WeightSyncScheme],
                                                      endpoint: str) -> None:
    if endpoint.startswith("inproc://"):
        # ZeroMQ releases an inproc name when its reaper thread gets to the closed
        # socket, not at close(): the previous case's name may still be taken.
        endpoint += f"-{uuid.uuid4().hex[:8]}"
    with anyio.fail_after(WAIT):
        async with running(scheme_cls(), 2, endpoint=endpoint) as (sender, workers, trainer, _):
            assert await sender.send() == 1
            assert [parameter_values(w.model) for w in workers] == [{1.0}, {1.0}]
            fill_parameters(trainer, 2.0)
            await sender.send_async()
            fill_parameters(trainer, 3.0)
            await sender.send_async()
            assert await sender.wait_ack(timeout=WAIT) == {0: 3, 1: 3}
            assert [parameter_values(w.model) for w in workers] == [{3.0}, {3.0}]


@pytest.mark.parametrize("scheme_cls", SCHEMES)
async def test_newest_wins_over_sockets(scheme_cls: type[WeightSyncScheme]) -> None:
    # shared memory: the third send goes to a third buffer (none is rewritten under a reader)
    shm = scheme_cls is SharedMemWeightSyncScheme
    scheme = scheme_cls(slot_timeout=0.2) if shm else scheme_cls()  # type: ignore[call-arg]
    with anyio.fail_after(WAIT):
        async with running(scheme, 1) as (sender, workers, trainer, _):
            worker = workers[0]
            worker.paused = True
            for fill in (1.0, 2.0, 3.0):
                fill_parameters(trainer, fill)
                await sender.send_async()
            receiver = worker.group["policy"]
            while receiver.pending_version != 1:
                await anyio.sleep(0.005)
            # 1 is in transit; 2 was queued in the sender, then replaced by 3 (never sent)
            assert sender.copies_sent == 1
            worker.paused = False
            worker.group.apply_pending()  # the next step boundary
            await worker.group.flush_acks(worker.link)
            assert await sender.wait_ack(timeout=WAIT) == {0: 3}  # 3 went out once 1 was acked
            assert sender.copies_sent == 2
            assert parameter_values(worker.model) == {3.0}


@pytest.mark.parametrize("scheme_cls", SCHEMES)
async def test_remote_failure_and_silent_worker_over_sockets(
        scheme_cls: type[WeightSyncScheme]) -> None:
    make = lambda i: net(0.0, width=8 if i != 1 else 9)  # noqa: E731 - worker 1 cannot apply
    with anyio.fail_after(WAIT):
        async with running(scheme_cls(), 3, make_model=make) as (sender, workers, _, scopes):
            with pytest.raises(RemoteError) as info:
                await sender.send(timeout=WAIT)
            assert info.value.peer == "worker-1"
            assert "WeightMismatchError" in info.value.remote_type
            assert "version 1 of model 'policy'" in "".join(info.value.__notes__)

            workers[2].paused = True  # alive (heartbeats) but never acks
            await sender.send_async(worker_ids=[0, 2])
            with pytest.raises(TimeoutError, match=r"worker\(s\) \[2\] \(peers worker-2\)"):
                await sender.wait_ack(timeout=0.5)

            scopes[2].cancel()  # now it is gone: its link says goodbye or goes silent
            await workers[2].stopped.wait()
            with pytest.raises(PeerLostError, match="worker-2"):
                await sender.wait_ack(timeout=WAIT)
            assert sender.outstanding == 0


@pytest.mark.parametrize("scheme_cls", SCHEMES)
async def test_late_joiner_over_sockets(scheme_cls: type[WeightSyncScheme]) -> None:
    with anyio.fail_after(WAIT):
        async with running(scheme_cls(), 1) as (sender, _workers, trainer, _):
            await sender.send()
            fill_parameters(trainer, 5.0)
            await sender.send()
            hub = sender.hub
            assert isinstance(hub, Hub)
            late = TaskWorker(hub.endpoint, 9, net(0.0), pickle.loads(pickle.dumps(scheme_cls())))
            async with anyio.create_task_group() as tg:
                tg.start_soon(late.run)
                while late.peer not in hub.peers:
                    await anyio.sleep(0.01)
                sender.add_worker(9, late.peer)
                assert await sender.on_worker_joined(9) == 2
                assert await sender.wait_ack(timeout=WAIT) == {9: 2}
                assert parameter_values(late.model) == {5.0}
                tg.cancel_scope.cancel()


# ------------------------------------------------------------------ a worker process


def _worker_process(endpoint: str, scheme: WeightSyncScheme) -> None:
    anyio.run(_worker_main, endpoint, scheme)


async def _worker_main(endpoint: str, scheme: WeightSyncScheme) -> None:
    model = net(0.0, width=256)
    bad: list[str] = []
    applied: list[int] = []
    receiver = scheme.init_on_worker("policy", model=model)
    async with Link(endpoint, identity=b"proc-worker", **LIVENESS) as link:
        await link.send({"hello": True}, kind="hello")
        while True:
            message = await link.recv()
            if message.kind == "stop":
                break
            receiver.on_message(message)
            if receiver.apply_pending():
                seen = parameter_values(model)  # what the policy would step with
                if seen != {float(receiver.version)}:
                    bad.append(f"version {receiver.version} but weights {sorted(seen)[:4]}")
                applied.append(receiver.version)
            await receiver.flush_acks(link)
        torn = getattr(receiver, "torn_reads", 0)
        await link.send({"bad": bad, "applied": applied, "torn": torn}, kind="report")
        await receiver.aclose()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # one backend: a process is slow to start
async def test_shared_memory_snapshots_are_whole_under_a_hammering_trainer() -> None:
    scheme = SharedMemWeightSyncScheme(slot_timeout=0)  # never wait for a free buffer: grow
    ctx = mp.get_context("spawn")
    trainer = net(0.0, width=256)
    versions = 150
    async with Hub("tcp://127.0.0.1:0", **LIVENESS) as hub:
        proc = ctx.Process(target=_worker_process, args=(hub.endpoint, scheme), daemon=True)
        proc.start()
        try:
            with anyio.fail_after(120):  # process start-up under load; not a speed bound
                item = await hub.recv()
                while not isinstance(item, Message):
                    item = await hub.recv()
                sender = scheme.init_on_sender("policy", hub=hub, model=trainer,
                                               workers={0: b"proc-worker"})
                for version in range(1, versions + 1):
                    fill_parameters(trainer, float(version))
                    assert await sender.send_async() == version
                    await anyio.lowlevel.checkpoint()
                acks = anyio.Event()

                async def wait() -> None:
                    assert (await sender.wait_ack(timeout=60))[0] == versions
                    acks.set()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(wait)
                    await acks.wait()
                await hub.send(b"proc-worker", {}, kind="stop")
                report = await hub.recv()
                while not (isinstance(report, Message) and report.kind == "report"):
                    report = await hub.recv()
        finally:
            await scheme.aclose()
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    body = report.body
    assert body["bad"] == [], body["bad"][:5]
    assert body["applied"] == sorted(body["applied"]) and body["applied"][-1] == versions
