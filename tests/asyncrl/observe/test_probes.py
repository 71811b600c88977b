"""Liveness and readiness probes: the server itself, then real hosts against real collectors.

``asyncrl worker`` (configured by ``ASYNCRL_*`` variables only, as in a
container) answers ``/readyz`` 503 until a collector admitted all its workers,
200 while it is admitted, 503 again once that collector is gone, 200 once a
restarted one admitted it again; ``/livez`` 200 throughout. ``asyncrl
env-worker`` the same for an AsyncBatchedCollector.

(The host is stopped while admitted: a ``--reconnect`` host stopped by SIGTERM
while its coordinator is gone has its workers hang in interpreter shutdown until
the host's SIGKILL, exit status 247/250; that is older than the probes, see the
report on issue #26.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import pytest

from asyncrl import AsyncBatchedCollector
from asyncrl._observe.probes import LIVENESS_PATH, READINESS_PATH, AdmissionBoard, ProbeServer
from asyncrl.testing import CountingEnv, ValuePolicy
from tests.multihost.lines import Lines
from tests.multihost.processes import free_port, kill_group

ROOT = Path(__file__).resolve().parents[3]
LIMIT = 120  # generous: 2 shared cores, worker processes to spawn
TRAINER = ROOT / "tests" / "multihost" / "trainer.py"


def get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    """Status and JSON body of GET http://127.0.0.1:port/path; (0, {}) if nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return 0, {}


async def wait_status(port: int, path: str, status: int) -> dict[str, Any]:
    with anyio.fail_after(LIMIT):
        while True:
            got, body = await anyio.to_thread.run_sync(get, port, path)
            if got == status:
                return body
            await anyio.sleep(0.2)


# -- the server --------------------------------------------------------------------------------
def test_answers_by_path_and_method() -> None:
    server = ProbeServer(lambda: {"ready": False, "admitted": 0})
    assert server.answer(b"GET /livez HTTP/1.1") == (200, {"alive": True})
    assert server.answer(b"GET /readyz?verbose HTTP/1.0") == (503, {"ready": False,
                                                                   "admitted": 0})
    assert server.answer(b"GET /other HTTP/1.1")[0] == 404
    assert server.answer(b"POST /livez HTTP/1.1")[0] == 405
    assert server.answer(b"\x00\xff garbage")[0] == 400
    assert server.answer(b"")[0] == 400


def test_admission_board_is_per_identity() -> None:
    board = AdmissionBoard([b"a", b"b"])
    board.set(b"b", True)
    board.set(b"stranger", True)  # not one of ours: ignored
    assert board.admitted() == [False, True]
    board.set(b"b", False)
    assert board.admitted() == [False, False]


@pytest.mark.anyio
async def test_a_real_server_flips_and_survives_hostile_clients(anyio_backend: str) -> None:
    state = {"ready": False}
    server = ProbeServer(lambda: dict(state), host="127.0.0.1", port=0)
    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            port = await tg.start(server.serve)
            assert (await anyio.to_thread.run_sync(get, port, LIVENESS_PATH))[0] == 200
            assert await anyio.to_thread.run_sync(get, port, READINESS_PATH) == (503, state)
            state["ready"] = True
            assert await anyio.to_thread.run_sync(get, port, READINESS_PATH) == (200, state)
            # A client that sends junk, one that sends too much, one that hangs up at once.
            for payload in (b"junk\r\n\r\n", b"G" * 100_000, b""):
                stream = await anyio.connect_tcp("127.0.0.1", port)
                async with stream:
                    if payload:
                        try:
                            await stream.send(payload)
                            await stream.receive()
                        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                            pass
            assert (await anyio.to_thread.run_sync(get, port, LIVENESS_PATH))[0] == 200
            tg.cancel_scope.cancel()


# -- a worker host against a real collector ------------------------------------------------------
def container_env(**settings: str) -> dict[str, str]:
    """The environment of a process started as a container would be: ASYNCRL_* only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCRL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env.update({f"ASYNCRL_{k.upper()}": v for k, v in settings.items()})
    return env


@pytest.mark.anyio
# The host and its trainers are subprocesses with their own event loops; this test's
# loop only polls HTTP, so a second backend would repeat the same (slow) processes.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_worker_host_ready_only_while_admitted() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    probe = free_port()
    # The host starts first and waits for its trainer (--reconnect), as pods do.
    host = subprocess.Popen(
        [sys.executable, "-m", "asyncrl", "worker"], cwd=ROOT, text=True,
        env=container_env(connect=endpoint, env="CartPole-v1", workers="2",
                          policy="asyncrl.testing:ParamPolicy", reconnect="true",
                          peer_timeout="2", probe_port=str(probe), probe_host="127.0.0.1"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    trainer = None
    try:
        await wait_status(probe, LIVENESS_PATH, 200)
        body = await wait_status(probe, READINESS_PATH, 503)
        assert body == {"ready": False, "workers": 2, "alive": body["alive"], "admitted": 0}
        trainer = subprocess.Popen([sys.executable, str(TRAINER), endpoint, "100000", "2"],
                                   cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, env=container_env())
        events = Lines(trainer)
        events.until(lambda e: e["event"] == "listening", LIMIT)
        body = await wait_status(probe, READINESS_PATH, 200)
        assert body == {"ready": True, "workers": 2, "alive": 2, "admitted": 2}
        events.until(lambda e: e["event"] == "batch", LIMIT)
        trainer.kill()  # gone without a goodbye: the workers wait for the next one
        trainer.wait(LIMIT)
        body = await wait_status(probe, READINESS_PATH, 503)
        assert body["admitted"] < 2 and body["alive"] == 2
        assert (await anyio.to_thread.run_sync(get, probe, LIVENESS_PATH))[0] == 200
        # A restarted trainer: the host rejoins and is ready again.
        trainer = subprocess.Popen([sys.executable, str(TRAINER), endpoint, "100000", "2"],
                                   cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, env=container_env())
        body = await wait_status(probe, READINESS_PATH, 200)
        assert body == {"ready": True, "workers": 2, "alive": 2, "admitted": 2}
        os.killpg(host.pid, signal.SIGTERM)  # as `docker stop` / the kubelet do
        output, _ = await anyio.to_thread.run_sync(lambda: host.communicate(timeout=LIMIT))
        assert host.returncode == 0, output
        assert "probes on http://127.0.0.1:" in output, output
    finally:
        for process in (trainer, host):
            if process is not None and process.poll() is None:
                kill_group(process) if process is host else process.kill()
                process.wait(LIMIT)


@pytest.mark.anyio
async def test_env_worker_ready_once_welcomed(anyio_backend: str) -> None:
    probe = free_port()
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(
                CountingEnv, num_envs=1, policy=ValuePolicy(1.0),
                frames_per_batch=16, listen="tcp://127.0.0.1:0",
                remote_workers=1) as collector:
            host = subprocess.Popen(
                [sys.executable, "-m", "asyncrl", "env-worker", "--backend", anyio_backend],
                cwd=ROOT, stderr=subprocess.PIPE, text=True,
                env=container_env(connect=collector.endpoint, env="asyncrl.testing:CountingEnv",
                                  probe_port=str(probe), probe_host="127.0.0.1"))
            try:
                body = await wait_status(probe, READINESS_PATH, 200)
                assert body == {"ready": True}
                async for _ in collector:
                    break
            finally:
                await collector.aclose()
                with anyio.fail_after(LIMIT):
                    code = await anyio.to_thread.run_sync(host.wait)
    assert code == 0, host.stderr.read() if host.stderr else ""
