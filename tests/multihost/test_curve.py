"""CURVE: encrypted, authenticated channels; unknown keys refused and logged."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys

import anyio
import pytest

from asyncrl import MultiAsyncCollector, MultiSyncCollector
from transports import (
    CurveClient,
    CurveServer,
    Hub,
    Link,
    PeerEvent,
    add_host,
    generate_keys,
    revoke_host,
)

pytestmark = pytest.mark.anyio
LIMIT = 60
FAST = {"heartbeat_interval": 0.05, "peer_timeout": 1.0}


async def next_message(hub: Hub):
    while isinstance(item := await hub.recv(), PeerEvent):
        pass
    return item


async def test_authorized_key_talks_encrypted(tmp_path) -> None:
    keys = generate_keys(tmp_path / "keys")
    with anyio.fail_after(LIMIT):
        async with Hub("tcp://127.0.0.1:0", curve=CurveServer.from_dir(keys), **FAST) as hub:
            async with Link(hub.endpoint, identity=b"w0", curve=CurveClient.from_dir(keys),
                            **FAST) as link:
                await link.send({"x": 1}, kind="batch")
                message = await next_message(hub)
                assert (message.peer, message.body) == (b"w0", {"x": 1})
        assert hub.refused_peers == 0


async def test_unknown_key_is_refused_and_logged(tmp_path, caplog) -> None:
    keys = generate_keys(tmp_path / "keys")
    stranger = generate_keys(tmp_path / "stranger")  # right server key, unknown client key
    (stranger / "coordinator.key").write_bytes((keys / "coordinator.key").read_bytes())
    caplog.set_level(logging.WARNING, logger="transports.curve")
    with anyio.fail_after(LIMIT):
        async with Hub("tcp://127.0.0.1:0", curve=CurveServer.from_dir(keys), **FAST) as hub:
            async with Link(hub.endpoint, identity=b"intruder",
                            curve=CurveClient.from_dir(stranger), **FAST) as link:
                with anyio.move_on_after(1.0):  # may block: the handshake never completes
                    await link.send({"x": 1}, kind="batch")
                while hub.refused_peers == 0:  # each handshake attempt is refused
                    await anyio.sleep(0.02)
                with anyio.move_on_after(0.5):  # it never gets in
                    item = await hub.recv()
                    pytest.fail(f"the hub accepted an unknown key: {item}")
    assert "not authorized" in caplog.text


async def test_plain_peer_cannot_reach_a_curve_hub(tmp_path) -> None:
    keys = generate_keys(tmp_path / "keys")
    with anyio.fail_after(LIMIT):
        async with Hub("tcp://127.0.0.1:0", curve=CurveServer.from_dir(keys), **FAST) as hub:
            async with Link(hub.endpoint, identity=b"plain", **FAST) as link:
                with anyio.move_on_after(1.0):  # may block: the handshake never completes
                    await link.send({"x": 1}, kind="batch")
                with anyio.move_on_after(1.0):
                    item = await hub.recv()
                    pytest.fail(f"a peer without keys got through: {item}")


def test_generate_refuses_to_overwrite(tmp_path) -> None:
    generate_keys(tmp_path)
    with pytest.raises(FileExistsError):
        generate_keys(tmp_path)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # end to end: one backend per test
async def test_collector_with_keys_serves_keyed_workers_and_refuses_others(tmp_path) -> None:
    keys = tmp_path / "keys"
    subprocess.run([sys.executable, "-m", "asyncrl.cli", "keys", "generate", str(keys)],
                   check=True, timeout=60)
    stranger = generate_keys(tmp_path / "stranger")
    (stranger / "coordinator.key").write_bytes((keys / "coordinator.key").read_bytes())
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector("CartPole-v1", num_workers=1, remote_workers=1,
                                      listen="tcp://127.0.0.1:0", curve_keys=str(keys),
                                      frames_per_batch=20, total_frames=40) as collector:
            intruder = subprocess.Popen(
                [sys.executable, "-m", "asyncrl.cli", "worker", "--connect", collector.endpoint,
                 "--env", "CartPole-v1", "--keys", str(stranger), "--peer-timeout", "3"])
            friend = subprocess.Popen(
                [sys.executable, "-m", "asyncrl.cli", "worker", "--connect", collector.endpoint,
                 "--env", "CartPole-v1", "--keys", str(keys)])
            try:
                batches = [b async for b in collector]
                while collector.refused_peers == 0:  # the intruder may start late
                    await anyio.sleep(0.05)
            finally:
                intruder.kill()
                friend.kill()
    assert len(batches) == 2


@pytest.mark.parametrize("anyio_backend", ["trio"])  # end to end: one backend per test
async def test_a_host_keyed_from_its_environment_joins_and_is_cut_off_when_revoked(
        tmp_path) -> None:
    keys = generate_keys(tmp_path / "keys")
    host = add_host(keys, "gpu1")
    mount = tmp_path / "mount"  # a secret mount of another layout: one bare key per file
    mount.mkdir()
    (mount / "tls.key").write_text(CurveClient.from_dir(host).secret_key.decode())
    (mount / "server.pub").write_text(CurveServer.from_dir(keys).public_key.decode())
    env = {**os.environ, "ASYNCRL_CURVE_SECRET_KEY_FILE": str(mount / "tls.key"),
           "ASYNCRL_CURVE_SERVER_KEY_FILE": str(mount / "server.pub")}
    with anyio.fail_after(2 * LIMIT):
        async with MultiAsyncCollector("CartPole-v1", num_workers=1, remote_workers=1,
                                       listen="tcp://127.0.0.1:0", curve_keys=str(keys),
                                       frames_per_batch=20, total_frames=10**9,
                                       on_worker_loss="continue") as collector:
            worker = subprocess.Popen(
                [sys.executable, "-m", "asyncrl.cli", "worker", "--connect", collector.endpoint,
                 "--env", "CartPole-v1"], env=env)  # no --keys: the environment's
            prefix = f"{socket.gethostname()}-{worker.pid}-w0"
            try:
                revoked = False
                async for _ in collector:
                    remote = [w for w in collector.statistics().workers
                              if w.name.startswith(prefix)]
                    if remote and remote[0].batches and not revoked:
                        revoke_host(keys, "gpu1")  # while it collects: no restart
                        revoked = True
                    elif revoked and remote[0].state == "lost":
                        break
                code = await anyio.to_thread.run_sync(lambda: worker.wait(timeout=30))
            finally:
                worker.kill()
    assert code == 4  # told why: refused (its key was revoked), not "the coordinator is gone"
