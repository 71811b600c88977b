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

ROOT = Path(__file__).resolve().parents[1]
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


@pytest.mark.parametrize("how", ["blocked-loop", "sigstop"])
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
