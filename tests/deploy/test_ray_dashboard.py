"""What KubeRay needs of the Ray image: a head with the dashboard, and ``ray job submit``.

A RayJob is submitted through the head's dashboard (KubeRay runs ``ray job submit``
against it); minimal Ray refuses both ("Cannot include dashboard with missing
packages", "requires the ray[default] installation"). The ``ray`` extra is
``ray[default]``: this test starts a local head with the dashboard, as KubeRay's
head pod does, and submits a job to it, as KubeRay's submitter does.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed")

# One local Ray cluster at a time: the other Ray tests share the group.
pytestmark = pytest.mark.xdist_group("ray")
LIMIT = 180  # seconds: a Ray head starts in 10-30 s on a loaded 2-core machine
RAY = [sys.executable, "-m", "ray.scripts.scripts"]  # the `ray` command of this Python


def _dashboard_dependencies() -> None:
    try:
        import ray.dashboard.optional_deps  # noqa: F401  (what Ray itself checks)
    except ImportError as exc:
        pytest.skip(f"ray[default]'s packages are missing ({exc}): minimal Ray has no "
                    "dashboard and no job submission; install the ray extra "
                    "(pip install -e '.[ray]', as scripts/setup.sh does)")


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _stop(head: subprocess.Popen[str], temp_dir: str) -> None:
    """End the head's process group, then any Ray process of this test's temp dir."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(head.pid, sig)
        except ProcessLookupError:
            break
        try:
            head.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    deadline = time.monotonic() + 20
    while (left := _ray_processes_of(temp_dir)) and time.monotonic() < deadline:
        for pid in left:  # ours only: their command lines name our temp dir
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


def _ray_processes_of(temp_dir: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if temp_dir.encode() in cmdline and int(entry.name) != os.getpid():
                found.append(int(entry.name))
    return found


@pytest.fixture
def ray_env() -> dict[str, str]:
    """Token authentication on, with a token of this test's own (Ray >= 2.5x: otherwise a
    token in ~/.ray/auth_token, left by another local cluster, would decide)."""
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(32)}


@pytest.fixture
def ray_head(ray_env: dict[str, str]) -> Iterator[str]:
    """A local Ray head with the dashboard, on free ports; yields the dashboard's address."""
    _dashboard_dependencies()
    # Short: Ray's unix sockets live under it (a socket path is at most 107 bytes).
    temp_dir = tempfile.mkdtemp(prefix="rayd", dir="/tmp")
    gcs, dashboard, agent, agent_grpc, client, node, objects, metrics, runtime_env = \
        _free_ports(9)
    command = [*RAY, "start", "--head", "--block", "--include-dashboard=true",
               "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
               f"--port={gcs}", f"--dashboard-agent-listen-port={agent}",
               f"--dashboard-agent-grpc-port={agent_grpc}",
               f"--ray-client-server-port={client}", f"--node-manager-port={node}",
               f"--object-manager-port={objects}", f"--metrics-export-port={metrics}",
               f"--runtime-env-agent-port={runtime_env}", "--num-cpus=1",
               "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}",
               "--disable-usage-stats"]
    head = subprocess.Popen(command, env=ray_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    address = f"http://127.0.0.1:{dashboard}"
    try:
        _wait_for_dashboard(head, address, ray_env["RAY_AUTH_TOKEN"])
        yield address
    finally:
        _stop(head, temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _wait_for_dashboard(head: subprocess.Popen[str], address: str, token: str) -> None:
    request = urllib.request.Request(f"{address}/api/version",
                                     headers={"Authorization": f"Bearer {token}"})
    deadline = time.monotonic() + LIMIT
    while time.monotonic() < deadline:
        if head.poll() is not None:
            output = head.stdout.read() if head.stdout else ""
            pytest.fail(f"ray start --head exited {head.returncode}:\n{output[-4000:]}")
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                if answer.status == 200 and "ray_version" in json.load(answer):
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"the Ray dashboard at {address} did not answer within {LIMIT} s")


def test_a_job_is_submitted_through_the_dashboard_of_a_local_head(
        ray_head: str, ray_env: dict[str, str]) -> None:
    done = subprocess.run(
        [*RAY, "job", "submit", "--address", ray_head, "--submission-id", "asyncrl-check",
         "--", sys.executable, "-c", "import ray; ray.init(); print('asyncrl job ran', 6 * 7)"],
        env=ray_env, capture_output=True, text=True, timeout=LIMIT)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert "asyncrl job ran 42" in output
    assert "Job 'asyncrl-check' succeeded" in output
