"""A busy trainer is not a gone trainer (issue 10, item 4).

A training step that holds the trainer's event loop (a synchronous optimizer
step, an evaluation, a checkpoint save) sends no heartbeats for a while. The
workers must wait for it, while a hub that is really gone (killed, closed)
is still reported lost in bounded time; and no race between a worker's
admission and its loss may crash the scheduler.

Heartbeats are short (``PEER_TIMEOUT`` of 1 s) and the loop is blocked with
``time.sleep`` for several peer timeouts, so that the tests stay short. Every
wait is bounded by ``anyio.fail_after``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import anyio
import pytest

from transports import Hub, Link, Message, PeerEvent, PeerLostError

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[3]
INTERVAL = 0.2
PEER_TIMEOUT = 1.0
FAST = {"heartbeat_interval": INTERVAL, "peer_timeout": PEER_TIMEOUT}
#: How long a "training step" holds the loop: several peer timeouts.
BUSY = 4.5 * PEER_TIMEOUT
#: Starting Python (and importing torch) in a child can take a while on a busy machine.
STARTUP = 90

ECHO_HUB = """
import sys, time
import anyio
from transports import Hub, Message

async def main(endpoint: str) -> None:
    async with Hub(endpoint, heartbeat_interval=0.2, peer_timeout=1.0) as hub:
        print(hub.endpoint, hub.instance, flush=True)
        async for item in hub:
            if not isinstance(item, Message):
                print(item.event, item.peer.decode(), flush=True)
                continue
            if item.kind == "block":
                time.sleep(item.body)  # a training step that holds the event loop
            await hub.send(item.peer, item.body, kind="echo")

anyio.run(main, sys.argv[1])
"""


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")])}


class EchoHub:
    """A hub in its own process that echoes messages ("block" first sleeps in its loop)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ECHO_HUB, "tcp://127.0.0.1:0"], cwd=ROOT, env=child_env(),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.endpoint, self.instance = self.proc.stdout.readline().split()

    def events(self) -> str:
        """What the hub printed (its peer events), once it has exited."""
        assert self.proc.stdout is not None
        return self.proc.stdout.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


async def echo(link: Link, body: object, *, kind: str = "data") -> object:
    await link.send(body, kind=kind)
    message = await link.recv()
    assert message.kind == "echo"
    return message.body


# ---------------------------------------------------------------- the link's liveness


# A hub process per case: one backend each (the link's side is what is tested).
@pytest.mark.parametrize(("anyio_backend", "how"),
                         [("asyncio", "blocked-loop"), ("trio", "sigstop")])
async def test_a_link_waits_for_a_busy_hub_and_goes_on_with_it(how: str) -> None:
    """Silent for several peer timeouts over a live connection: busy, not lost."""
    hub = await anyio.to_thread.run_sync(EchoHub)
    try:
        with anyio.fail_after(STARTUP):
            async with Link(hub.endpoint, identity=b"w", **FAST) as link:
                assert await echo(link, "first") == "first"
                if how == "blocked-loop":
                    await link.send(BUSY, kind="block")
                else:  # the whole process frozen: its kernel still holds the connection
                    hub.proc.send_signal(signal.SIGSTOP)
                started = time.monotonic()
                with anyio.move_on_after(BUSY if how == "sigstop" else 3 * BUSY):
                    body = (await link.recv()).body  # no PeerLostError while it is busy
                    assert how == "blocked-loop" and body == BUSY
                assert time.monotonic() - started > 2 * PEER_TIMEOUT
                if how == "sigstop":
                    hub.proc.send_signal(signal.SIGCONT)
                assert link.connected
                assert await echo(link, "after") == "after"
                assert link._hub_instance == hub.instance  # the same hub, never lost
    finally:
        hub.kill()
    # Nor did the hub give the link up: its pings were read before silence was judged.
    assert hub.events().count("joined") == 1  # lost, it would have joined again


async def test_a_link_whose_hub_process_is_killed_reports_it_lost() -> None:
    hub = await anyio.to_thread.run_sync(EchoHub)
    try:
        with anyio.fail_after(STARTUP):
            async with Link(hub.endpoint, identity=b"w", **FAST) as link:
                assert await echo(link, "hi") == "hi"
                hub.proc.send_signal(signal.SIGKILL)
                # The kernel closes its connection; the link gives it peer_timeout to come
                # back. Generous bound, the link's own is about PEER_TIMEOUT.
                with anyio.fail_after(PEER_TIMEOUT + 10):
                    with pytest.raises(PeerLostError, match="connection closed"):
                        await link.recv()
                assert not link.connected and not link.hub_closed
    finally:
        hub.kill()


async def test_a_link_whose_hub_says_goodbye_reports_it_lost_at_once() -> None:
    patient = {"heartbeat_interval": 0.2, "peer_timeout": 60}
    with anyio.fail_after(30):
        async with Hub("tcp://127.0.0.1:0", **patient) as hub, \
                Link(hub.endpoint, identity=b"w", **patient) as link:
            await link.send("hi")
            while link._hub_instance is None:
                await anyio.sleep(0.01)
            await hub.aclose()
            with anyio.fail_after(5):  # far less than the 60 s peer timeout
                with pytest.raises(PeerLostError, match="goodbye"):
                    await link.recv()
            assert link.hub_closed


async def test_a_link_that_never_reaches_a_hub_reports_it_lost() -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        with anyio.fail_after(30):
            async with Link(f"tcp://127.0.0.1:{port}", identity=b"w", **FAST) as link:
                with pytest.raises(PeerLostError, match="never reached"):
                    await link.recv()


async def test_a_silent_hub_is_logged_once_not_lost(caplog: pytest.LogCaptureFixture) -> None:
    """A raw ROUTER that completes the handshake but never speaks: connected and silent."""
    import zmq

    context = zmq.Context.instance()
    router = context.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    try:
        with anyio.fail_after(30), caplog.at_level("WARNING", logger="transports"):
            async with Link(f"tcp://127.0.0.1:{port}", identity=b"w", **FAST) as link:
                with anyio.move_on_after(4 * PEER_TIMEOUT):
                    await link.recv()
                    pytest.fail("nothing was sent")
                assert link.connected
        silent = [r for r in caplog.records if "silent" in r.getMessage()]
        assert len(silent) == 1, [r.getMessage() for r in caplog.records]
    finally:
        router.close(linger=0)


async def test_the_connection_monitor_is_closed_with_the_link() -> None:
    with anyio.fail_after(30):
        async with Hub(f"inproc://{uuid.uuid4().hex}", **FAST) as hub:
            async with Link(hub.endpoint, identity=b"w", **FAST) as link:
                monitor = link._monitor
                assert monitor is not None and not monitor.closed
            assert monitor.closed and link._monitor is None


async def test_closing_connected_links_leaves_the_process_able_to_connect() -> None:
    # ZeroMQ's I/O thread sends monitor events with a blocking send: a link that
    # closed its end of the monitor before stopping it left that thread blocked on
    # the "disconnected" event of its closing socket, and every tcp:// and ipc://
    # socket of the process (not inproc://) stopped moving: the CI cascade.
    with anyio.fail_after(60):
        async with Hub("tcp://127.0.0.1:0", **FAST) as hub:
            for i in range(20):
                async with Link(hub.endpoint, identity=f"w{i}".encode(), **FAST) as link:
                    await link.send("hello")
                    await link.wait_connected()  # the monitor saw the connection come up
        with anyio.fail_after(10):  # a fresh pair still talks
            async with Hub("tcp://127.0.0.1:0", **FAST) as hub, \
                    Link(hub.endpoint, identity=b"last", **FAST) as link:
                await link.send("still alive")
                while True:
                    message = await hub.recv()
                    if isinstance(message, Message):
                        assert message.body == "still alive"
                        break


ECHO_LINK = """
import sys
import anyio
from transports import Link

async def main(endpoint: str) -> None:
    async with Link(endpoint, identity=b"w", heartbeat_interval=0.2, peer_timeout=1.0) as link:
        await link.send("hello")
        async for message in link:
            await link.send(message.body, kind="echo")

anyio.run(main, sys.argv[1])
"""


async def test_a_hub_whose_loop_is_blocked_keeps_its_peers() -> None:
    """The trainer's side: silence is judged only once everything queued was read."""
    async with Hub("tcp://127.0.0.1:0", **FAST) as hub:
        proc = await anyio.open_process([sys.executable, "-c", ECHO_LINK, hub.endpoint],
                                        cwd=ROOT, env=child_env(), stdin=subprocess.DEVNULL,
                                        stdout=None, stderr=None)
        try:
            with anyio.fail_after(STARTUP):
                assert await hub.recv() == PeerEvent(b"w", "joined")
                hello = await hub.recv()
                assert isinstance(hello, Message) and hello.body == "hello"
            with anyio.fail_after(30):
                time.sleep(BUSY)  # the training step: no heartbeat, no read for a while
                await hub.send(b"w", "still there?")
                item = await hub.recv()
                assert isinstance(item, Message), f"the hub reported {item} after a busy step"
                assert item.body == "still there?"
                assert hub.peers == {b"w"}
        finally:
            with anyio.CancelScope(shield=True):
                proc.kill()
                await proc.aclose()


# ---------------------------------------------------------------- collectors end to end


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_a_training_step_that_holds_the_loop_does_not_kill_the_workers(
        sync: bool) -> None:
    from asyncrl import MultiAsyncCollector, MultiSyncCollector
    from asyncrl.testing import CountingEnv, ParamPolicy

    per_batch, batches = 16, 6
    kind = MultiSyncCollector if sync else MultiAsyncCollector
    options = {} if sync else {"prefetch": 2}
    frames = 0
    with anyio.fail_after(STARTUP + 60):
        async with kind(CountingEnv, ParamPolicy(), num_workers=2, frames_per_batch=per_batch,
                        total_frames=per_batch * batches, **FAST, **options) as collector:
            pids: list[int] = []
            async for batch in collector:
                frames += batch.numel()
                if not pids:
                    pids = list(collector.worker_pids)
                    time.sleep(BUSY)  # a training step that never yields to the event loop
                    await collector.update_policy_weights()  # and the workers still apply
            assert collector.worker_pids == pids and len(pids) == 2
            assert all(_alive(pid) for pid in pids)
            workers = collector.statistics().workers
            assert len(workers) == 2  # nobody was lost and replaced
            assert all(w.state != "lost" for w in workers)
    assert frames == per_batch * batches


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


# ---------------------------------------------------------------- admission races


class Coordinator:
    """A Coordinator on a real Hub, with a weight sender wired as MultiCollector wires it."""

    def __init__(self, hub: Hub, *, sync: bool = False, on_join: object = None,
                 budget: int | None = None, token: str = "", loss: str = "continue") -> None:
        from asyncrl._coordinator.coordinator import Coordinator
        from asyncrl.testing import ParamPolicy
        from asyncrl.weights import WeightSender
        from tests.asyncrl.coordinator.rules import rules

        self.hub = hub
        self.sender = WeightSender("policy", hub, model=ParamPolicy(),
                                   workers=lambda: {w.index: w.peer
                                                    for w in self.scheduler.roster.live_workers})
        self.scheduler = Coordinator(
            hub, *rules(sync=sync, share_frames=[4], prefetch=2, accept_remote=True,
                        on_worker_loss=loss, batch_budget=budget, token=token,
                        first_remote_index=1),
            on_join=on_join or self.catch_up)

    async def catch_up(self, worker: object) -> None:
        await self.sender.on_worker_joined(worker.index)  # type: ignore[attr-defined]


def hello(name: bytes, attempt: int = 0, *, slot: int = -1, token: str = "") -> dict:
    from asyncrl._protocol import PROTOCOL, Hello

    return Hello(protocol=PROTOCOL, name=name.decode(), host="test-host", pid=os.getpid(),
                 specs={}, slot=slot, token=token, attempt=attempt).to_body()


async def next_order(link: Link) -> Message:
    """The next message from the coordinator that is not weights."""
    while (message := await link.recv()).kind == "weights":
        pass
    return message


async def admit(coordinator: Coordinator, link: Link) -> Message:
    await link.send(hello(link.identity), kind="hello")
    welcome = await next_order(link)
    assert welcome.kind == "welcome", welcome
    return welcome


@pytest.mark.parametrize("where", ["welcome", "catch-up", "sender-lock", "grant"])
async def test_a_worker_lost_during_its_admission_does_not_crash_the_scheduler(
        where: str) -> None:
    """The loss is injected at each await point of the admission."""
    from transports import Hub as _Hub

    async with _Hub(f"inproc://{uuid.uuid4().hex}", **FAST) as hub:
        coordinator: Coordinator
        lost = anyio.Event()

        async def lose(worker: object) -> None:
            await coordinator.scheduler._on_lost(worker.peer)  # type: ignore[attr-defined]
            lost.set()

        async def on_join(worker: object) -> None:
            if worker.peer != b"doomed":  # type: ignore[attr-defined]
                await coordinator.catch_up(worker)
            elif where == "catch-up":  # lost while on_join awaited something else
                await lose(worker)
                await coordinator.catch_up(worker)
            elif where == "sender-lock":
                assert coordinator.sender._lock is not None
                with anyio.fail_after(10):  # another send holds the lock: lose it meanwhile
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(coordinator.catch_up, worker)
                        while coordinator.sender._lock.statistics().tasks_waiting == 0:
                            await anyio.sleep(0.01)
                        await lose(worker)
                        release.set()
            else:
                await coordinator.catch_up(worker)
                if where == "grant":
                    await lose(worker)

        coordinator = Coordinator(hub, on_join=on_join, budget=10)
        scheduler = coordinator.scheduler
        await coordinator.sender.send_async()  # version 1: a joiner has weights to catch up
        held, release = anyio.Event(), anyio.Event()

        async def hold_lock() -> None:  # a send in progress (copying big weights, say)
            async with coordinator.sender._get_lock():
                held.set()
                await release.wait()
        if where == "welcome":
            real_send = hub.send

            async def send(peer: bytes, body: object, *, kind: str = "data",
                           meta: dict | None = None) -> None:
                if kind == "welcome" and peer == b"doomed":
                    await lose(scheduler.roster.workers[peer])  # gone just as it was welcomed
                    return
                await real_send(peer, body, kind=kind, meta=meta)

            hub.send = send  # type: ignore[method-assign]

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg, \
                    Link(hub.endpoint, identity=b"doomed", **FAST) as doomed, \
                    Link(hub.endpoint, identity=b"next", **FAST) as survivor:
                tg.start_soon(scheduler.run)
                if where == "sender-lock":
                    tg.start_soon(hold_lock)
                    await held.wait()
                await doomed.send(hello(b"doomed"), kind="hello")
                await lost.wait()
                # The scheduler task is alive and admits the next worker normally.
                welcome = await admit(coordinator, survivor)
                assert [w.peer for w in scheduler.roster.live_workers] == [b"next"]
                assert welcome.body["index"] == scheduler.roster.live_workers[0].index
                assert scheduler.state.losses.failure is None
                # The lost worker was granted nothing: its credits are not a leak.
                # (The survivor's grant follows its welcome and catch-up: wait for it.)
                while scheduler.state.rounds.budget > 10 - scheduler.state.config.prefetch:
                    await anyio.sleep(0.01)
                await anyio.sleep(0.1)  # a leak would show as a second grant here
                assert scheduler.state.rounds.budget == 10 - scheduler.state.config.prefetch
                tg.cancel_scope.cancel()


@pytest.mark.parametrize("slot", [-1, 0], ids=["remote", "local-slot"])
async def test_a_repeated_hello_while_admitted_is_welcomed_again_the_same(slot: int) -> None:
    """A trainer busy when a worker joined: the worker said hello twice before any answer."""
    async with Hub(f"inproc://{uuid.uuid4().hex}", **FAST) as hub:
        coordinator = Coordinator(hub, token="secret")
        with anyio.fail_after(30):
            async with Link(hub.endpoint, identity=b"w", **FAST) as link, \
                    anyio.create_task_group() as tg:
                for attempt in (0, 1, 2):
                    await link.send(hello(b"w", attempt, slot=slot, token="secret"),
                                    kind="hello")
                while hub.statistics().queued < 4:  # joined + 3 hellos: all waiting
                    await anyio.sleep(0.01)
                tg.start_soon(coordinator.scheduler.run)
                orders = [await next_order(link)]
                while not (orders[-1].kind == "welcome" and orders[-1].body["attempt"] == 2):
                    orders.append(await next_order(link))
                    assert orders[-1].kind != "refuse", orders[-1].body
                welcomes = [m.body for m in orders if m.kind == "welcome"]
                assert [w["attempt"] for w in welcomes] == [0, 1, 2]
                assert len({w["index"] for w in welcomes}) == 1  # one admission
                # After the welcome it takes, the worker gets what it is owed: its credits.
                credits = await next_order(link)
                assert credits.kind == "collect"
                assert credits.body == {"request": welcomes[0]["index"], "credits": 2}
                workers = coordinator.scheduler.roster.live_workers
                assert len(workers) == 1 and workers[0].credits == 2
                tg.cancel_scope.cancel()


async def test_a_repeated_hello_during_a_sync_round_gets_the_share_asked_again() -> None:
    async with Hub(f"inproc://{uuid.uuid4().hex}", **FAST) as hub:
        coordinator = Coordinator(hub, sync=True)
        scheduler = coordinator.scheduler
        with anyio.fail_after(30):
            async with Link(hub.endpoint, identity=b"w", **FAST) as link, \
                    anyio.create_task_group() as tg:
                tg.start_soon(scheduler.run)
                welcome = await admit(coordinator, link)
                tg.start_soon(scheduler.next_round)
                first = await next_order(link)
                assert first.kind == "collect"
                await link.send(hello(b"w", 1), kind="hello")  # the first answers were late
                again = await next_order(link)
                assert again.kind == "welcome" and again.body["attempt"] == 1
                assert again.body["index"] == welcome.body["index"]
                share = await next_order(link)
                assert share.kind == "collect" and share.body == first.body
                tg.cancel_scope.cancel()


async def test_a_worker_found_gone_while_a_round_is_asked_for_does_not_break_the_round() -> None:
    """What a busy trainer meets when it comes back: a worker left while it was away.

    The trainer's own grant finds the peer gone and drops it from the round it is
    iterating over (once "dictionary changed size during iteration").
    """
    from transports import PeerLostError as _Lost

    async with Hub(f"inproc://{uuid.uuid4().hex}", **FAST) as hub:
        coordinator = Coordinator(hub, sync=True)
        scheduler = coordinator.scheduler
        with anyio.fail_after(30):
            async with Link(hub.endpoint, identity=b"w2", **FAST) as survivor:
                async with Link(hub.endpoint, identity=b"w1", **FAST) as leaving, \
                        anyio.create_task_group() as tg:
                    tg.start_soon(scheduler.run)
                    await admit(coordinator, leaving)
                    await admit(coordinator, survivor)
                    tg.cancel_scope.cancel()  # the loss must be met by the grant itself
                while True:  # until the hub can no longer route to the closed link
                    try:
                        await hub.send(b"w1", None, kind="probe")
                    except _Lost:
                        break
                    await anyio.sleep(0.01)
                with anyio.move_on_after(1):
                    await scheduler.next_round()  # waits for w2's share: no error
                assert scheduler.state.rounds.round is not None
                assert list(scheduler.state.rounds.round.targets) == [b"w2"]
                assert (await next_order(survivor)).kind == "collect"
                assert scheduler.state.losses.failure is None


async def test_a_worker_that_said_hello_twice_to_a_busy_trainer_joins_once_and_collects() -> None:
    """The real worker: its hellos wait in the hub while the trainer is busy."""
    from asyncrl._protocol import Control
    from asyncrl._worker.spec import WorkerSpec
    from asyncrl._worker.worker import run_worker
    from asyncrl.testing import CountingEnv

    codes: list[int] = []
    async with Hub("tcp://127.0.0.1:0", **FAST) as hub:
        coordinator = Coordinator(hub, token="secret")
        scheduler = coordinator.scheduler

        async def worker() -> None:
            codes.append(await run_worker(hub.endpoint, WorkerSpec(CountingEnv), identity=b"w",
                                          slot=0, token="secret", **FAST))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker)
                while hub.statistics().queued < 3:  # joined + two hellos, unanswered
                    await anyio.sleep(0.05)
                tg.start_soon(scheduler.run)  # the trainer is back
                who, batch = await scheduler.next_batch()
                assert who.index == 0 and batch.numel() == 4
                assert batch["collector", "worker_id"].unique().tolist() == [0]
                assert [w.index for w in scheduler.roster.live_workers] == [0]
                await hub.send(b"w", Control("close").to_body(), kind=Control.KIND)
                while not codes:
                    await anyio.sleep(0.05)
                tg.cancel_scope.cancel()  # the scheduler task
    assert codes == [0]


async def test_a_replacement_lost_during_its_admission_leaves_the_share_to_the_next() -> None:
    """Sync, on_worker_loss="wait": a newcomer owes a lost worker's share; lost itself
    before its grant, the share must stay owed (not be asked of a worker that is gone)."""
    async with Hub(f"inproc://{uuid.uuid4().hex}", **FAST) as hub:
        coordinator: Coordinator

        async def on_join(worker: object) -> None:
            await coordinator.catch_up(worker)
            if worker.peer == b"doomed":  # type: ignore[attr-defined]
                await coordinator.scheduler._on_lost(b"doomed")

        coordinator = Coordinator(hub, sync=True, loss="wait", on_join=on_join)
        scheduler = coordinator.scheduler
        with anyio.fail_after(30):
            async with Link(hub.endpoint, identity=b"first", **FAST) as first, \
                    Link(hub.endpoint, identity=b"doomed", **FAST) as doomed, \
                    Link(hub.endpoint, identity=b"next", **FAST) as newcomer, \
                    anyio.create_task_group() as tg:
                tg.start_soon(scheduler.run)
                await admit(coordinator, first)
                tg.start_soon(scheduler.next_round)
                assert (await next_order(first)).kind == "collect"
                round_ = scheduler.state.rounds.round
                assert round_ is not None
                await scheduler._on_lost(b"first")  # its share is owed by the next to join
                assert round_.replacements == 1
                await admit(coordinator, doomed)
                await admit(coordinator, newcomer)
                share = await next_order(newcomer)
                assert share.kind == "collect" and share.body["request"] == round_.request
                assert list(round_.targets) == [b"next"]
                tg.cancel_scope.cancel()


async def test_a_round_started_during_a_catch_up_orders_the_newcomer_after_its_weights(
        ) -> None:
    """The catch-up waits for the sender's lock (another send holds it) while the trainer
    starts a round: the newcomer's collect order must still come after its weights, or it
    steps with the weights it had (version 0) until they land mid-batch."""
    from transports import Hub as _Hub

    async with _Hub(f"inproc://{uuid.uuid4().hex}", **FAST) as hub:

        async def no_join_hook(worker: object) -> None:
            pass

        coordinator = Coordinator(hub, sync=True, on_join=no_join_hook)
        scheduler = coordinator.scheduler
        scheduler.outbox.attach(coordinator.sender)  # as MultiCollector wires it: catch-up first
        await coordinator.sender.send_async()  # version 1, for nobody yet
        held, release = anyio.Event(), anyio.Event()

        async def hold_lock() -> None:  # a send in progress (copying big weights, say)
            async with coordinator.sender._get_lock():
                held.set()
                await release.wait()

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg, \
                    Link(hub.endpoint, identity=b"w", **FAST) as worker:
                tg.start_soon(scheduler.run)
                tg.start_soon(hold_lock)
                await held.wait()
                await worker.send(hello(b"w"), kind="hello")
                assert (await worker.recv()).kind == "welcome"
                tg.start_soon(scheduler.next_round)  # the trainer's loop, another task
                # Until the round's order for the newcomer waits behind its catch-up (an
                # order that did not wait would already be on its way: this never ends).
                catching_up = scheduler.outbox._catching_up
                while (b"w" not in catching_up
                       or catching_up[b"w"].statistics().tasks_waiting == 0):
                    await anyio.sleep(0.01)
                release.set()
                kinds = []
                while len(kinds) < 2:
                    message = await worker.recv()
                    if message.kind in ("weights", "collect"):
                        kinds.append(message.kind)
                assert kinds == ["weights", "collect"]
                tg.cancel_scope.cancel()
