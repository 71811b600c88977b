"""Chaos: strangers on the listening tcp port (impersonation, forged errors, flood, fuzz).

Everything stays on 127.0.0.1 and every loop is bounded. Each scenario runs on one
anyio backend (the suite covers both) to keep it short.
"""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import struct
from typing import Any

import anyio
import anyio.to_thread
import pytest
import zmq

from asyncrl import MultiAsyncCollector, MultiSyncCollector
from asyncrl._protocol import PROTOCOL, ErrorReport, Hello
from asyncrl.testing import ValuePolicy, identity_env
from transports import CurveClient, ErrorPayload, Link, add_host, generate_keys
from transports._codec import encode_message

from .helpers import LIMIT, LIVENESS, RSS_GROWTH_MB, assert_frames, pids_in, rss_mb, train

pytestmark = [pytest.mark.anyio, pytest.mark.chaos]
TOTAL = 200


def listening(sync: bool = True, **kwargs):
    cls = MultiSyncCollector if sync else MultiAsyncCollector
    return cls(identity_env, ValuePolicy(0.0), num_workers=2, frames_per_batch=20,
               total_frames=TOTAL, listen="tcp://127.0.0.1:0", **LIVENESS, **kwargs)


def tcp_address(endpoint: str) -> tuple[str, int]:
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    return host, int(port)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_socket_reusing_a_workers_identity_takes_nothing_over(sandbox) -> None:
    with anyio.fail_after(40):  # a hijacked route shows as this bound running out
        async with listening() as c, contextlib.AsyncExitStack() as impostors:

            async def impersonate(c, index: int) -> None:
                if index != 1:
                    return
                victim = c.worker_pids[1]
                link = await impostors.enter_async_context(
                    Link(c.endpoint, identity=f"local-1-{victim}", **LIVENESS))
                hello = Hello(protocol=PROTOCOL, name=f"local-1-{victim}", host="evil",
                              pid=victim, specs={}, slot=1, token="guessed")
                await link.send(hello.to_body(), kind=Hello.KIND)

            pids = list(c.worker_pids)
            batches, values = await train(c, after_batch=impersonate)
            assert c.worker_pids == pids
        await sandbox.assert_clean()
    assert_frames(batches, values, total_frames=TOTAL)
    assert set(pids) <= pids_in(batches[-2:]), "a worker stopped delivering"


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_copied_identity_with_another_curve_key_takes_nothing_over(sandbox,
                                                                          tmp_path) -> None:
    """The identity is public (the INFO "joined" line, ``statistics().workers[].name``):
    an authorized host that copies it, with its own key, gets no route and no slot."""
    keys = generate_keys(tmp_path / "keys")
    evil = CurveClient.from_dir(add_host(keys, "evil"))
    with anyio.fail_after(LIMIT):
        async with listening(curve_keys=str(keys)) as c, \
                contextlib.AsyncExitStack() as impostors:

            async def impersonate(c, index: int) -> None:
                if index != 1:
                    return
                victim = next(w for w in c.statistics().workers if w.index == 1)
                link = await impostors.enter_async_context(
                    Link(c.endpoint, identity=victim.name, curve=evil, **LIVENESS))
                hello = Hello(protocol=PROTOCOL, name=victim.name, host="evil",
                              pid=victim.pid, specs={}, slot=1, token="guessed")
                await link.send(hello.to_body(), kind=Hello.KIND)
                await link.send(ErrorReport(ErrorPayload("builtins:RuntimeError", "forged"),
                                            fatal=True).to_body(), kind=ErrorReport.KIND)

            pids = list(c.worker_pids)
            batches, values = await train(c, after_batch=impersonate)
            assert c.worker_pids == pids
        await sandbox.assert_clean()
    assert_frames(batches, values, total_frames=TOTAL)
    assert set(pids) <= pids_in(batches[-2:]), "a worker stopped delivering"


@pytest.mark.parametrize(("anyio_backend", "remote_type"),
                         [("asyncio", "builtins:RuntimeError"),
                          ("trio", "builtins:StopAsyncIteration")])
async def test_a_forged_error_from_a_stranger_ends_nothing(sandbox, remote_type: str) -> None:
    with anyio.fail_after(LIMIT):
        async with listening(sync=False) as c, contextlib.AsyncExitStack() as strangers:

            async def forge(c, index: int) -> None:
                if index == 1:
                    link = await strangers.enter_async_context(Link(c.endpoint, **LIVENESS))
                    report = ErrorReport(ErrorPayload(remote_type, "forged by a stranger"),
                                         fatal=True)
                    await link.send(report.to_body(), kind=ErrorReport.KIND)

            batches, values = await train(c, after_batch=forge)
        await sandbox.assert_clean()
    assert_frames(batches, values, total_frames=TOTAL)


def _zmtp_prelude() -> bytes:
    """A ZMTP 3.0 NULL greeting and READY from a DEALER: enough to be read as a peer."""
    greeting = (b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0")
                + b"\0" + b"\0" * 31)
    properties = b""
    for name, value in ((b"Socket-Type", b"DEALER"), (b"Identity", b"")):
        properties += bytes([len(name)]) + name + struct.pack(">I", len(value)) + value
    ready = b"\x05READY" + properties
    return greeting + b"\x04" + bytes([len(ready)]) + ready


def _flood(address: tuple[str, int], megabytes: int) -> int:
    """One connection that announces a 1 GiB message and streams ``megabytes`` of it."""
    sent = 0
    chunk = b"\0" * (1 << 20)
    with socket.create_connection(address, timeout=10) as s:
        try:
            s.sendall(_zmtp_prelude() + b"\x02" + struct.pack(">Q", 1 << 30))
            for _ in range(megabytes):
                s.sendall(chunk)
                sent += 1
        except OSError:
            pass  # refused, cut or throttled by the coordinator: what we hope for
    return sent


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_flood_before_any_hello_leaves_the_trainers_memory_bounded(sandbox) -> None:
    peak: list[float] = []

    async def sample() -> None:
        while True:
            peak.append(rss_mb())
            await anyio.sleep(0.02)

    with anyio.fail_after(LIMIT):
        async with listening(sync=False) as c:
            await c.__anext__()  # workers are up: what follows is the flood's doing
            baseline = rss_mb()
            address = tcp_address(c.endpoint)
            async with anyio.create_task_group() as tg:
                tg.start_soon(sample)
                async with anyio.create_task_group() as floods:
                    for _ in range(3):
                        floods.start_soon(anyio.to_thread.run_sync, _flood, address, 150)
                batches, values = await train(c)
                tg.cancel_scope.cancel()
        await sandbox.assert_clean()
    assert max(peak) - baseline < RSS_GROWTH_MB, (
        f"three unauthenticated connections raised the trainer's memory by "
        f"{max(peak) - baseline:.0f} MiB")
    assert_frames(batches, values, total_frames=TOTAL - 20, from_start=False)


def _fuzz(endpoint: str, seed: int, messages: int = 2000, connections: int = 100) -> None:
    rng = random.Random(seed)
    address = tcp_address(endpoint)
    for _ in range(connections):  # raw bytes, no handshake
        with socket.create_connection(address, timeout=5) as s:
            try:
                s.sendall(rng.randbytes(rng.randrange(1, 4096)))
            except OSError:
                pass
    kinds = ["hello", "batch", "error", "ack", "weights", "collect", "control", "data",
             "relay_hello", "x" * 300]
    context: Any = zmq.Context.instance()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.SNDTIMEO, 5000)
    dealer.connect(endpoint)
    try:
        for i in range(messages):
            body = rng.choice([{}, {"request": 1, "frames": None}, [1, 2], "x", None,
                               {"type": "builtins:ValueError"}, rng.randbytes(64)])
            frames = [bytearray(f) for f in encode_message(body, kind=rng.choice(kinds), seq=i)]
            for _ in range(rng.randrange(4)):  # flip a few bytes of the header
                header = frames[0]
                header[rng.randrange(len(header))] = rng.randrange(256)
            if rng.random() < 0.2:
                frames.append(bytearray(rng.randbytes(rng.randrange(256))))
            dealer.send_multipart(frames)
    finally:
        dealer.close()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_fuzzed_port_neither_ends_the_run_nor_floods_the_log(
        sandbox, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    with anyio.fail_after(LIMIT):
        async with listening() as c:

            async def fuzz(c, index: int) -> None:
                if index == 1:
                    await anyio.to_thread.run_sync(_fuzz, c.endpoint, index)

            batches, values = await train(c, after_batch=fuzz)
        await sandbox.assert_clean()
    assert_frames(batches, values, total_frames=TOTAL)
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) <= 100, (f"{len(lines)} warnings for 2,000 hostile messages, e.g. "
                               f"{[r.getMessage()[:120] for r in lines[:3]]}")
