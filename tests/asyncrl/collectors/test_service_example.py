"""examples/service.py: the Starlette app every endpoint of it, and its clean shutdown.

Two ways in: the ASGI app driven by httpx with its lifespan run in the test
(both anyio backends), and a real ``uvicorn examples.service:app`` process on a
loopback port, stopped by SIGTERM to its process group as systemd does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")
pytest.importorskip("prometheus_client")

import httpx

from tests.multihost.processes import alive

ROOT = Path(__file__).resolve().parents[3]
LIMIT = 120  # generous: 2 shared cores, worker processes to start
SMALL = {"ASYNCRL_WORKERS": "2", "ASYNCRL_FRAMES_PER_BATCH": "64", "ASYNCRL_PUSH_EVERY": "2"}


async def wait_for(client: httpx.AsyncClient, what: str, ok: Any) -> dict[str, Any]:
    with anyio.fail_after(LIMIT):  # polling a status endpoint is what an operator does
        while True:
            status: dict[str, Any] = (await client.get("/status")).json()
            if ok(status):
                return status
            await anyio.sleep(0.1)


@pytest.mark.anyio
async def test_every_endpoint_and_a_clean_lifespan_exit(
        anyio_backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in SMALL.items():
        monkeypatch.setenv(key, value)
    from examples.service import app

    with anyio.fail_after(LIMIT):
        async with app.router.lifespan_context(app):
            service = app.state.service
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://service") as client:
                status = await wait_for(client, "frames and a pushed version",
                                        lambda s: s["frames"] > 0 and s["policy_version"] >= 1)
                assert {"frames", "fps", "policy_version", "workers"} <= set(status)
                assert status["error"] is None and status["ready"] is True
                assert status["state"] == "running"
                page = await client.get("/")
                assert page.status_code == 200
                assert page.headers["content-type"].startswith("text/html")
                assert page.text.count("<canvas id=") == 4 and 'fetch("status"' in page.text
                assert (await client.get("/livez")).status_code == 200
                ready = await client.get("/readyz")
                assert (ready.status_code, ready.json()["workers"]) == (200, 2)
                assert len(status["workers"]) == 2
                pids = [w["pid"] for w in status["workers"]]
                assert sorted(pids) == sorted(service.collector.worker_pids)
                assert all(w["state"] in ("collecting", "idle") for w in status["workers"])

                metrics = await client.get("/metrics")
                assert metrics.status_code == 200
                assert metrics.headers["content-type"].startswith("text/plain")
                assert "asyncrl_frames_total " in metrics.text
                assert 'asyncrl_worker_state{host=' in metrics.text

                before = service.collector.statistics().policy_version
                pushed = (await client.post("/weights")).json()
                assert pushed["version"] > before  # acked: every worker applied it

                assert (await client.post("/pause")).json() == {"paused": True}
                assert (await client.get("/status")).json()["paused"] is True
                frames = (await client.get("/status")).json()["frames"]
                await anyio.sleep(0.5)
                assert (await client.get("/status")).json()["frames"] == frames  # none while paused
                assert (await client.post("/resume")).json() == {"paused": False}
                await wait_for(client, "frames after resume", lambda s: s["frames"] > frames)
    assert not any(alive(pid) for pid in pids)
    assert service.collector.worker_pids == []


@pytest.mark.anyio
async def test_ready_once_a_remote_worker_host_joined(
        anyio_backend: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The multi-node shape of docs/deploy.md: one local worker, one `asyncrl worker` host."""
    settings = {"ASYNCRL_WORKERS": "1", "ASYNCRL_REMOTE_WORKERS": "1",
                "ASYNCRL_LISTEN": "tcp://127.0.0.1:0", "ASYNCRL_ON_WORKER_LOSS": "continue",
                "ASYNCRL_FRAMES_PER_BATCH": "64"}
    for key, value in settings.items():
        monkeypatch.setenv(key, value)
    from examples.service import app

    caplog.set_level("INFO", logger="examples.service")
    host = None
    with anyio.fail_after(LIMIT):
        async with app.router.lifespan_context(app):
            service = app.state.service
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://service") as client:
                assert (await client.get("/livez")).status_code == 200
                assert (await client.get("/readyz")).status_code == 503  # no remote host yet
                assert "service ready" not in caplog.text
                env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCRL_")}
                host = subprocess.Popen(
                    [sys.executable, "-m", "asyncrl", "worker", "--env", "CartPole-v1",
                     "--policy", "examples.service:make_policy"], cwd=ROOT,
                    env={**env, "PYTHONPATH": str(ROOT),
                         "ASYNCRL_CONNECT": service.collector.endpoint},
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                    start_new_session=True)
                try:
                    while (await client.get("/readyz")).status_code != 200:
                        await anyio.sleep(0.1)
                    assert "service ready: 2 workers joined (1 local, 1 remote)" in caplog.text
                    status = await wait_for(client, "frames from both workers", lambda s: all(
                        w["frames"] > 0 for w in s["workers"]) and len(s["workers"]) == 2)
                    assert {w["host"] for w in status["workers"]}  # named
                    os.killpg(host.pid, signal.SIGKILL)  # the remote host dies: "continue"
                    host.wait(LIMIT)
                    await wait_for(client, "the lost host", lambda s: "lost" in [
                        w["state"] for w in s["workers"]])
                    frames = (await client.get("/status")).json()["frames"]
                    await wait_for(client, "frames after the loss", lambda s: s["frames"] > frames)
                    assert (await client.get("/livez")).status_code == 200
                    assert (await client.get("/status")).json()["error"] is None
                finally:
                    if host.poll() is None:
                        os.killpg(host.pid, signal.SIGKILL)
                        host.wait(LIMIT)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


@pytest.mark.parametrize(("command", "group"), [
    ("uvicorn", True), ("module", True), ("module", False)],
    ids=["uvicorn-process-group", "module-process-group", "module-pid"])
def test_sigterm_stops_the_service_cleanly_with_no_worker_left(command: str, group: bool) -> None:
    port = _free_port()
    env = {**os.environ, **SMALL, "PYTHONPATH": str(ROOT)}
    argv = (["-m", "uvicorn", "examples.service:app"] if command == "uvicorn"
            else ["-m", "examples.service"])
    process = subprocess.Popen(
        [sys.executable, *argv, "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)  # its own process group, as a systemd unit's
    pids: list[int] = []
    try:
        deadline = time.monotonic() + LIMIT
        while time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()[0]
            try:
                status = _get(f"http://127.0.0.1:{port}/status")
            except OSError:
                status = {}
            if status.get("frames", 0) > 0 and len(status["workers"]) == 2:
                pids = [w["pid"] for w in status["workers"]]
                break
            time.sleep(0.2)
        assert pids, "the service never reported frames from 2 workers"
        if group:
            os.killpg(process.pid, signal.SIGTERM)  # systemd's KillMode=control-group
        else:
            process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    # The uvicorn command re-raises the SIGTERM it handled after its graceful shutdown
    # (systemd counts "terminated by SIGTERM" as a clean stop); the module exits 0.
    expected = (0, -signal.SIGTERM) if command == "uvicorn" else (0,)
    assert process.returncode in expected, output
    assert "Application shutdown complete" in output, output
    assert "examples.service: service ready: 2 workers joined" in output, output
    assert "examples.service: service stopped" in output, output
    assert "asyncrl.collectors: MultiAsyncCollector closed" in output, output
    assert "Traceback" not in output and "ERROR" not in output, output
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)  # reaped as the service exits; the kernel may lag a little
    assert not any(alive(pid) for pid in pids)


# -- GET /: the live status page, in a real headless browser ---------------------------------
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable",
            "headless_shell")


def _browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def test_the_status_page_needs_nothing_from_the_network() -> None:
    page = (ROOT / "examples" / "status_page.html").read_text()
    # No script, style sheet or font from elsewhere: it must work offline.
    assert not re.findall(r"""(?:src|href)\s*=|@import|url\(|https?://""", page)
    assert 'fetch("status"' in page  # its one request, relative to where it is served


def test_the_status_page_charts_live_data_in_a_headless_browser(tmp_path: Path) -> None:
    browser = _browser()
    if browser is None:
        pytest.skip("no Chromium binary on PATH (one of " + ", ".join(BROWSERS) + "): the "
                    "status page is checked in a real headless browser only where one is "
                    "installed, e.g. apt-get install chromium")
    port = _free_port()
    env = {**os.environ, **SMALL, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "examples.service", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        deadline = time.monotonic() + LIMIT
        status: dict[str, Any] = {}
        while time.monotonic() < deadline and not (
                status.get("frames", 0) > 0 and status.get("episode_return_mean") is not None):
            assert process.poll() is None, process.communicate()[0]
            try:
                status = _get(f"http://127.0.0.1:{port}/status")
            except OSError:
                pass
            time.sleep(0.2)
        assert status.get("frames", 0) > 0, "the service never reported frames"
        # --virtual-time-budget: the page's timers run 6 s of virtual time (several polls
        # of /status, each a real request) before the DOM is dumped.
        dumped = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=6000",
             "--dump-dom", f"http://127.0.0.1:{port}/"],
            capture_output=True, text=True, timeout=LIMIT)
        dom = dumped.stdout
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    assert "<h1>asyncrl service</h1>" in dom, dumped.stderr[-2000:]
    samples = re.search(r'<body[^>]*data-samples="(\d+)"', dom)
    assert samples is not None and int(samples.group(1)) >= 2, dom[-3000:]
    summary = re.search(r'<p id="summary">([^<]*)</p>', dom)
    assert summary is not None and re.fullmatch(
        r"running: \d+ frames, [\d.]+ frames/s, return [\d.]+, policy v\d+ \(lag \d+\), "
        r"\d+ updates, 2 workers", summary.group(1)), summary
    for chart in ("fps", "return", "lag", "workers"):
        tag = re.search(rf'<canvas id="{chart}"[^>]*>', dom)
        assert tag is not None, chart
        numbers = {k: int(v) for k, v in re.findall(r'data-([a-z-]+)="(\d+)"', tag.group(0))}
        assert numbers["points"] >= 2, (chart, numbers)
        # The empty chart paints its frame; the chart with data paints more.
        assert numbers["ink"] > numbers["frame-ink"] + 20, (chart, numbers)
    assert '<p id="error"></p>' in dom  # every poll answered, no training error
