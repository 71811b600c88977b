"""Applying the key Secrets reaches a live trainer: the kubelet's ``..data`` swap, end to end.

The trainer is configured as deploy/k8s/trainer.yaml configures it (its secret key
and ``authorized/`` from ``ASYNCRL_CURVE_*`` variables, ``revoked/`` beside it), its
three folders laid out and later swapped as a kubelet does (tests/deploy/kubelet.py).
Worker hosts run ``asyncrl worker --keys`` with their own key (a pod's folder).
Revoking host 0 and authorizing host 1 is what docs/deploy.md says to do: ``asyncrl
keys`` on the key folder, then ``kubectl apply`` of the two Secrets made from it.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncrl import MultiAsyncCollector
from transports import add_host, generate_keys, revoke_host

from .kubelet import atomic_write

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # two hosts start: ~80 s under load
LIMIT = 120
HOSTS = "asyncrl-worker-host"


def folder(path: Path) -> dict[str, bytes]:
    """A Secret made with ``kubectl create secret generic --from-file=DIR/``."""
    return {p.name: p.read_bytes() for p in sorted(path.glob("*.key"))} if path.is_dir() else {}


def apply_secrets(keys: Path, mounts: Path) -> None:
    atomic_write(mounts / "authorized", folder(keys / "authorized"))
    atomic_write(mounts / "revoked", folder(keys / "revoked"))


def start_host(keys: Path, name: str, endpoint: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "worker", "--connect", endpoint,
         "--env", "CartPole-v1", "--keys", str(keys / "hosts" / name)])


def of_host(collector: MultiAsyncCollector, host: subprocess.Popen[bytes]) -> list[Any]:
    prefix = f"{socket.gethostname()}-{host.pid}-w0"
    return [w for w in collector.statistics().workers if w.name.startswith(prefix)]


async def batches_from(collector: MultiAsyncCollector, host: subprocess.Popen[bytes]) -> None:
    """Iterate the collector until ``host``'s worker has delivered a batch."""
    async for _ in collector:
        if (mine := of_host(collector, host)) and mine[0].batches:
            return


@pytest.mark.parametrize("anyio_backend", ["trio"])  # processes and files only: once is enough
async def test_applying_the_secrets_revokes_one_host_and_admits_another_live(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = generate_keys(tmp_path / "keys")
    add_host(keys, f"{HOSTS}-0")
    revoke_host(keys, "worker")  # every host has its own key
    mounts = tmp_path / "mounts"
    atomic_write(mounts / "coordinator", {"coordinator.key_secret":
                                          (keys / "coordinator.key_secret").read_bytes()})
    apply_secrets(keys, mounts)
    monkeypatch.setenv("ASYNCRL_CURVE_SECRET_KEY_FILE",
                       str(mounts / "coordinator" / "coordinator.key_secret"))
    monkeypatch.setenv("ASYNCRL_CURVE_AUTHORIZED", str(mounts / "authorized"))
    with anyio.fail_after(LIMIT):
        async with MultiAsyncCollector("CartPole-v1", num_workers=0, remote_workers=1,
                                       listen="tcp://127.0.0.1:0", frames_per_batch=20,
                                       total_frames=10**9, on_worker_loss="continue") as collector:
            first = start_host(keys, f"{HOSTS}-0", collector.endpoint)
            second: subprocess.Popen[bytes] | None = None
            try:
                await batches_from(collector, first)
                # `asyncrl keys`, then `kubectl apply` of both Secrets: one swap each
                revoke_host(keys, f"{HOSTS}-0")
                add_host(keys, f"{HOSTS}-1")
                apply_secrets(keys, mounts)
                while of_host(collector, first)[0].state != "lost":
                    await anyio.sleep(0.05)  # cut off within the trainer's reload interval
                code = await anyio.to_thread.run_sync(lambda: first.wait(timeout=30))
                second = start_host(keys, f"{HOSTS}-1", collector.endpoint)
                await batches_from(collector, second)  # the new key, accepted live
            finally:
                for host in (first, second):
                    if host is not None:
                        host.kill()
                        host.wait()
    assert code == 4  # refused: its key was revoked, not "the coordinator is gone"
