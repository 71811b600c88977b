"""A peer in another process, killed with SIGKILL in the middle of a conversation.

No goodbye is possible: the hub must notice by itself (its closed connection at
once, its silence at the latest), report the peer lost and fail the ticket the
peer never acknowledged. A peer whose connection is cut while it lives, and
that reconnects at once, is not lost.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import anyio.abc
import pytest

from transports import Hub, Message, PeerEvent, PeerLostError

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
PEER_TIMEOUT = 0.5
#: Starting Python and importing torch in the child can take a while on a busy machine.
STARTUP = 60

PEER_SCRIPT = """
import os, sys
import anyio
from transports import Link

async def main(endpoint: str) -> None:
    async with Link(endpoint, identity=b"victim", heartbeat_interval=0.05,
                    peer_timeout=30) as link:
        await link.send({"pid": os.getpid()}, kind="hello")
        async for message in link:
            if message.kind == "apply":
                await link.ack(message, result={"pid": os.getpid(), "n": message.body})
            # "hold": the peer is busy with it and never answers

anyio.run(main, sys.argv[1])
"""


async def test_killed_peer_process_is_lost_and_fails_its_ticket(tmp_path: Path) -> None:
    async with Hub("tcp://127.0.0.1:0", heartbeat_interval=0.05,
                   peer_timeout=PEER_TIMEOUT) as hub:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), os.environ.get("PYTHONPATH", "")])}
        proc = await anyio.open_process([sys.executable, "-c", PEER_SCRIPT, hub.endpoint],
                                        cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                        stdout=None, stderr=None)
        try:
            with anyio.fail_after(STARTUP):
                assert await hub.recv() == PeerEvent(b"victim", "joined")
                hello = await hub.recv()
            assert isinstance(hello, Message) and hello.body == {"pid": proc.pid}

            with anyio.fail_after(10):
                ticket = await hub.send_async([b"victim"], 1, kind="apply")
                assert await hub.wait_ack(ticket) == {b"victim": {"pid": proc.pid, "n": 1}}
                pending = await hub.send_async([b"victim"], 2, kind="hold")
                await anyio.sleep(0.1)  # it is mid-conversation: received, not answered
                assert pending.pending == {b"victim"}

            proc.send_signal(signal.SIGKILL)
            with anyio.fail_after(10):
                assert await proc.wait() == -signal.SIGKILL

            # Generous bound; the hub's own timeout is PEER_TIMEOUT.
            with anyio.fail_after(PEER_TIMEOUT + 5):
                assert await hub.recv() == PeerEvent(b"victim", "lost")
                with pytest.raises(PeerLostError) as caught:
                    await hub.wait_ack(pending)
            assert caught.value.peers == [b"victim"]
            assert "victim" in str(caught.value)
            assert hub.peers == frozenset()
            with pytest.raises(PeerLostError):
                await hub.send(b"victim", "anyone there?")
        finally:
            with anyio.CancelScope(shield=True):
                if proc.returncode is None:
                    proc.kill()
                await proc.aclose()


async def test_killed_peer_is_lost_on_its_closed_connection_not_its_silence() -> None:
    # peer_timeout is long: only the closed connection can make the loss this quick.
    async with Hub("tcp://127.0.0.1:0", heartbeat_interval=1, peer_timeout=60,
                   disconnect_grace=0.2) as hub:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), os.environ.get("PYTHONPATH", "")])}
        proc = await anyio.open_process([sys.executable, "-c", PEER_SCRIPT, hub.endpoint],
                                        cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                        stdout=None, stderr=None)
        try:
            with anyio.fail_after(STARTUP):
                assert await hub.recv() == PeerEvent(b"victim", "joined")
                assert isinstance(await hub.recv(), Message)
                pending = await hub.send_async([b"victim"], 2, kind="hold")
            proc.send_signal(signal.SIGKILL)
            with anyio.fail_after(10):  # far less than peer_timeout
                lost = await hub.recv()
                assert lost == PeerEvent(b"victim", "lost")
                assert lost.reason == "disconnected"
                with pytest.raises(PeerLostError):
                    await hub.wait_ack(pending)
        finally:
            with anyio.CancelScope(shield=True):
                if proc.returncode is None:
                    proc.kill()
                await proc.aclose()


class _CuttableProxy:
    """A TCP proxy to the hub whose connections the test can cut (the peer lives on)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.streams: list[anyio.abc.SocketStream] = []

    async def serve(self, listener, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await listener.serve(self._handle)

    async def _handle(self, client) -> None:
        server = await anyio.connect_tcp("127.0.0.1", self.target_port)
        self.streams += [client, server]

        async def pipe(a, b) -> None:
            try:
                async for chunk in a:
                    await b.send(chunk)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                pass
            with anyio.CancelScope(shield=True):
                await a.aclose()
                await b.aclose()

        async with anyio.create_task_group() as tg:
            tg.start_soon(pipe, client, server)
            tg.start_soon(pipe, server, client)

    async def cut(self) -> None:
        streams, self.streams = self.streams, []
        for stream in streams:
            await stream.aclose()


async def test_a_peer_that_reconnects_within_the_grace_is_not_lost() -> None:
    # Its process lives: its connection is cut, its DEALER reconnects at once and
    # takes its route back before the probe; a peer that never reconnects is lost.
    from transports import Link

    async with Hub("tcp://127.0.0.1:0", heartbeat_interval=0.2, peer_timeout=60,
                   disconnect_grace=0.5) as hub, anyio.create_task_group() as tg:
        proxy = _CuttableProxy(int(hub.endpoint.rsplit(":", 1)[1]))
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        await tg.start(proxy.serve, listener)
        async with Link(f"tcp://127.0.0.1:{port}", identity=b"stays", heartbeat_interval=0.2,
                        peer_timeout=60) as stays:
            await stays.send("hi", kind="hello")
            with anyio.fail_after(10):
                assert await hub.recv() == PeerEvent(b"stays", "joined")
                assert isinstance(await hub.recv(), Message)
            await proxy.cut()
            with anyio.fail_after(10):
                while hub._disconnects.disconnections < 1:
                    await anyio.sleep(0.05)
            await anyio.sleep(1.5)  # well past the grace: a probe ran
            assert b"stays" in hub.peers
            assert hub.recv_nowait() is None  # no "lost"
            await stays.send("still here", kind="hello")
            with anyio.fail_after(10):
                item = await hub.recv()
            assert isinstance(item, Message) and item.body == "still here"
        tg.cancel_scope.cancel()
