"""A peer in another process, killed with SIGKILL in the middle of a conversation.

No goodbye is possible: the hub must notice the silence by itself, report the
peer lost within its timeout and fail the ticket the peer never acknowledged.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
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
