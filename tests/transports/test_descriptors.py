"""A listening hub's descriptors: half-open handshakes dropped, the soft limit raised."""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from transports import Hub

ROOT = str(Path(__file__).resolve().parents[2])


@pytest.mark.anyio
async def test_a_connection_that_never_finishes_its_handshake_is_dropped() -> None:
    async with Hub("tcp://127.0.0.1:0", handshake_timeout=0.5) as hub:
        port = int(hub.endpoint.rsplit(":", 1)[1])

        def silent_client() -> None:
            # libzmq's own default would keep it 30 s: a timeout here fails the test.
            with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
                while s.recv(4096):  # the hub's greeting, then the end of the connection
                    pass

        with anyio.fail_after(30):
            await anyio.to_thread.run_sync(silent_client)


PROBE = """
import json, resource, anyio
from transports import Hub

async def main():
    async with Hub("tcp://127.0.0.1:0"):
        print(json.dumps(resource.getrlimit(resource.RLIMIT_NOFILE)))

anyio.run(main)
"""


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] <= 1024,
                    reason="the hard limit is the soft limit already")
def test_binding_a_hub_raises_the_soft_limit_to_the_hard_limit() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]

    def soft_1024() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))

    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=60, preexec_fn=soft_1024, cwd=ROOT, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [hard, hard]
