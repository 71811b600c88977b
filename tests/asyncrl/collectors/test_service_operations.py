"""examples/service.py in production: a token for the control endpoints, a readiness
threshold, and a checkpoint that carries a run over a trainer restart (#36 items 6, 7, 9).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

pytest.importorskip("starlette")
pytest.importorskip("httpx")
pytest.importorskip("prometheus_client")

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse

from examples.service import Settings
from examples.service_checkpoint import Checkpoint, RunState
from examples.service_control import ControlToken
from tests.asyncrl.collectors.test_service_example import _free_port, _get, wait_for

ROOT = Path(__file__).resolve().parents[3]
LIMIT = 120
SMALL = {"ASYNCRL_WORKERS": "2", "ASYNCRL_FRAMES_PER_BATCH": "64", "ASYNCRL_PUSH_EVERY": "2"}
POSTS = ("/pause", "/resume", "/weights")


def _secret_volume(root: Path, token: str, generation: int) -> None:
    """Write ``token`` the way the kubelet updates a Secret volume: a new timestamped
    directory, then an atomic swap of the ``..data`` symlink the key links through."""
    data = root / f"..gen{generation}"
    data.mkdir()
    (data / "token").write_text(token + "\n")
    (root / "..data_tmp").symlink_to(data.name)
    os.replace(root / "..data_tmp", root / "..data")
    if not (root / "token").is_symlink():
        (root / "token").symlink_to("..data/token")


def test_the_token_is_compared_whole_and_reread_when_the_secret_rotates(tmp_path: Path) -> None:
    _secret_volume(tmp_path, "first-token", 1)
    token = ControlToken(tmp_path / "token")
    assert token.allows("Bearer first-token") and token.allows("bearer first-token")
    for wrong in (None, "", "Bearer", "Bearer first", "Bearer first-token2", "Basic first-token",
                  "first-token"):
        assert not token.allows(wrong), wrong
    _secret_volume(tmp_path, "second-token", 2)
    assert token.allows("Bearer second-token")
    assert not token.allows("Bearer first-token")


def test_a_token_file_that_is_empty_missing_or_huge_is_refused_at_start(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="is empty: write a token"):
        ControlToken(tmp_path / "empty")
    with pytest.raises(OSError, match="cannot read the control token file"):
        ControlToken(tmp_path / "absent")
    (tmp_path / "huge").write_text("x" * 5000)
    with pytest.raises(ValueError, match="more than 4096 bytes"):
        ControlToken(tmp_path / "huge")


def _post(*authorization: bytes, client: str = "10.1.2.3") -> Request:
    """A control request as Starlette hands it over: header values are raw bytes."""
    return Request({"type": "http", "method": "POST", "path": "/pause", "query_string": b"",
                    "headers": [(b"authorization", value) for value in authorization],
                    "client": (client, 40000)})


def _answer(refusal: JSONResponse | None) -> tuple[int, str] | None:
    return None if refusal is None else (refusal.status_code,
                                         json.loads(bytes(refusal.body))["error"])


def test_a_deleted_token_file_refuses_control_until_a_token_is_back(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _secret_volume(tmp_path, "first-token", 1)
    token = ControlToken(tmp_path / "token")
    good = b"Bearer first-token"
    assert _answer(token.refusal(_post(good))) is None
    shutil.rmtree(tmp_path / "..gen1")  # the Secret's data is gone: revoked, not kept
    caplog.set_level(logging.INFO, logger="examples.service")
    for _ in range(20):  # what an unauthenticated client can send: one line in the log
        assert _answer(token.refusal(_post(good))) == (
            503, "control is refused: the service cannot use its control token file (its log "
                 "says why); it is read again at every request")
        assert _answer(token.refusal(_post(b"Bearer guess"))) is not None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cannot read the control token file" in warnings[0], warnings
    _secret_volume(tmp_path, "second-token", 2)
    assert _answer(token.refusal(_post(good)))[0] == 401  # type: ignore[index]
    assert _answer(token.refusal(_post(b"Bearer second-token"))) is None
    assert "can be used again" in caplog.records[-1].getMessage()


@pytest.mark.parametrize("content", ["", "x" * 5000, "two words", "t\u00f8ken"],
                         ids=["empty", "huge", "spaces", "non-ascii"])
def test_a_token_file_that_turns_unusable_mid_run_refuses_control(
        tmp_path: Path, content: str) -> None:
    path = tmp_path / "token"
    path.write_text("first-token\n")
    token = ControlToken(path)
    path.write_text(content)
    assert _answer(token.refusal(_post(b"Bearer first-token")))[0] == 503  # type: ignore[index]
    assert token.broken is not None and str(path) in token.broken


def test_a_token_rewritten_in_place_applies_at_the_next_request(tmp_path: Path) -> None:
    """Same inode, same size, same mtime (a rewrite within one clock tick): still read."""
    path = tmp_path / "token"
    path.write_text("aaaa-1111\n")
    token = ControlToken(path)
    stamp = path.stat()
    with path.open("r+") as file:
        file.write("bbbb-2222\n")
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert _answer(token.refusal(_post(b"Bearer bbbb-2222"))) is None
    assert _answer(token.refusal(_post(b"Bearer aaaa-1111")))[0] == 401  # type: ignore[index]


def test_a_token_file_that_is_not_one_rfc6750_token_is_refused_at_start(tmp_path: Path) -> None:
    """A token with spaces or non-ASCII bytes could never be sent as one header value."""
    for content in ("two words", "t\u00f8ken", "tab\there"):
        (tmp_path / "token").write_text(content)
        with pytest.raises(ValueError, match="does not hold one RFC 6750 token"):
            ControlToken(tmp_path / "token")


def test_several_authorization_headers_are_refused_whichever_comes_first(
        tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t0ken")
    token = ControlToken(tmp_path / "token")
    for headers in ((b"Bearer t0ken", b"Bearer wrong"), (b"Bearer wrong", b"Bearer t0ken"),
                    (b"Bearer t0ken", b"Bearer t0ken")):
        assert _answer(token.refusal(_post(*headers))) == (
            400, "expected one Authorization header, got 2")


@pytest.mark.parametrize("value", [
    b"Bearer t\xc3\xb8ken", b"Bearer t\xf8ken", "Bearer t0ken\u00e9".encode("latin-1"),
    b"Bearer " + b"t0ken" * 200_000, b"Bearer t0ken" + b" " * 100_000, b"t0ken",
    b"Bearer", b"Bearer ", b"Basic t0ken", b"Bearer\tt0ken", b"Bearer t0ken t0ken",
    b"Bearer t0ken\x00", b"\xff" * 64],
    ids=["utf8", "latin1", "trailing-latin1", "1MB", "100KB-spaces", "no-scheme", "scheme-only",
         "empty-token", "basic", "tab", "two-tokens", "nul", "binary"])
def test_a_malformed_authorization_header_is_refused_as_malformed(
        tmp_path: Path, value: bytes) -> None:
    (tmp_path / "token").write_text("t0ken")
    token = ControlToken(tmp_path / "token")
    status, error = _answer(token.refusal(_post(value)))  # type: ignore[misc]
    assert status == 401
    assert error.endswith(f"the one sent ({len(value)} characters) is not 'Bearer ' and one "
                          "RFC 6750 token"), error
    assert _answer(token.refusal(_post(b"bEaReR   t0ken  "))) is None  # RFC: 1*SP, any case


def test_the_readiness_threshold_is_a_count_or_a_share_of_the_expected_workers() -> None:
    assert [Settings(ready_workers=t).required_workers(3) for t in ("100%", "60%", "1", "3")] \
        == [3, 2, 1, 3]
    for bad in ("0", "4", "0%", "150%", "most"):
        with pytest.raises(ValueError, match=r"expected a count in 1\.\.3 .* got"):
            Settings(ready_workers=bad).required_workers(3)


def _set(monkeypatch: pytest.MonkeyPatch, **settings: str) -> None:
    for key, value in {**SMALL, **settings}.items():
        monkeypatch.setenv(key, value)


@pytest.mark.anyio
async def test_control_endpoints_need_the_token_and_reads_stay_open(
        anyio_backend: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _secret_volume(tmp_path, "t0ken", 1)
    _set(monkeypatch, ASYNCRL_CONTROL_TOKEN_FILE=str(tmp_path / "token"))
    from examples.service import app

    good = {"Authorization": "Bearer t0ken"}
    with anyio.fail_after(LIMIT):
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://svc") as client:
                await wait_for(client, "status", lambda s: s["ready"])
                for path in ("/livez", "/readyz", "/status", "/metrics", "/"):
                    assert (await client.get(path)).status_code == 200, path
                for path in POSTS:  # loopback, but a token is configured: it is needed
                    answer = await client.post(path)
                    assert answer.status_code == 401, path
                    assert answer.headers["www-authenticate"].startswith("Bearer")
                    assert "none came" in answer.json()["error"]
                    wrong = await client.post(path, headers={"Authorization": "Bearer t0ke"})
                    assert wrong.status_code == 401
                    assert "does not match" in wrong.json()["error"]
                assert (await client.post("/pause", headers=good)).json() == {"paused": True}
                assert (await client.post("/resume", headers=good)).json() == {"paused": False}
                assert (await client.post("/weights", headers=good)).json()["version"] >= 1
                _secret_volume(tmp_path, "n3w", 2)  # the Secret was rotated
                assert (await client.post("/pause", headers=good)).status_code == 401
                assert (await client.post("/resume", headers={
                    "Authorization": "Bearer n3w"})).json() == {"paused": False}
                # Without a token file: loopback clients only.
                app.state.service.control = ControlToken(None)
                remote = httpx.ASGITransport(app=app, client=("10.1.2.3", 40000))
                async with httpx.AsyncClient(transport=remote, base_url="http://svc") as other:
                    refused = await other.post("/pause")
                    assert refused.status_code == 403
                    assert "ASYNCRL_CONTROL_TOKEN_FILE" in refused.json()["error"]
                    assert (await other.get("/status")).status_code == 200
                assert (await client.post("/pause")).json() == {"paused": True}
                assert (await client.post("/resume")).json() == {"paused": False}


@pytest.mark.anyio
async def test_readyz_answers_503_below_the_operators_threshold(
        anyio_backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _set(monkeypatch, ASYNCRL_WORKERS="3", ASYNCRL_READY_WORKERS="60%",
         ASYNCRL_ON_WORKER_LOSS="continue")
    from examples.service import app

    with anyio.fail_after(LIMIT):
        async with app.router.lifespan_context(app):
            collector = app.state.service.collector
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://svc") as client:
                await wait_for(client, "status", lambda s: s["ready"] and s["frames"] > 0)
                ready = await client.get("/readyz")
                assert (ready.status_code, ready.json()["workers"], ready.json()["required"]) \
                    == (200, 3, 2)
                pids = collector.worker_pids
                for killed, code in ((1, 200), (2, 503)):
                    os.kill(pids[killed], signal.SIGKILL)
                    await wait_for(client, "status", lambda s, n=killed: sum(
                        w["state"] == "lost" for w in s["workers"]) == n)
                    answer = await client.get("/readyz")
                    assert (answer.status_code, answer.json()["workers"]) == (code, 3 - killed)
                assert (await client.get("/livez")).status_code == 200


@pytest.mark.anyio
async def test_a_restarted_service_continues_from_its_checkpoint(
        anyio_backend: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "ckpt" / "run.pt"
    _set(monkeypatch, ASYNCRL_CHECKPOINT=str(path), ASYNCRL_CHECKPOINT_EVERY="3")
    from examples.service import app

    with anyio.fail_after(LIMIT):
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://svc") as client:
                await wait_for(client, "status",
                               lambda s: s["policy_version"] >= 3 and s["updates"] >= 6)
            first = app.state.service
        saved = Checkpoint(path).load()
        assert saved is not None  # the lifespan's exit (SIGTERM's path) wrote the last state
        stats = first.collector.statistics()
        assert (saved.frames, saved.batches, saved.policy_version, saved.updates) == (
            stats.frames, stats.batches, stats.policy_version, first.updates)
        assert list(tmp_path.joinpath("ckpt").iterdir()) == [path]  # no temporary left

        async with app.router.lifespan_context(app):
            service = app.state.service
            restored = service.collector.statistics()
            assert (restored.frames, restored.batches) == (saved.frames, saved.batches)
            assert restored.policy_version == saved.policy_version
            for name, tensor in service.policy.state_dict().items():
                assert torch.equal(tensor, saved.policy[name]), name
            assert service.optimizer.state_dict()["state"].keys() == saved.optimizer["state"].keys()
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://svc") as client:
                # A training step after the restart (frames alone grow a moment before
                # the step that uses them is counted).
                status = await wait_for(
                    client, "status", lambda s: s["ready"] and s["updates"] > saved.updates)
            # Its first push continues the numbering; its steps learn from new batches.
            assert status["policy_version"] >= saved.policy_version + 1
            assert status["batches"] > saved.batches
            assert status["frames"] > saved.frames
            with pytest.raises(RuntimeError, match="before any send"):
                service.collector.weight_sender().continue_from(0)  # numbering is set once


def test_sigterm_saves_the_run_and_the_next_start_continues_it(tmp_path: Path) -> None:
    path = tmp_path / "run.pt"
    env = {**os.environ, **SMALL, "PYTHONPATH": str(ROOT), "ASYNCRL_CHECKPOINT_EVERY": "1000"}
    first: RunState | None = None
    for run in range(2):
        port = _free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", "examples.service", "--port", str(port),
             "--checkpoint", str(path)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            # Run 1 starts from run 0's saved counts: wait for frames past those (not only
            # past the last status run 0 answered, which the restore itself already passes).
            status = _poll(port, process, version=2 + 2 * run,
                           frames=first.frames if first else 0)
            process.send_signal(signal.SIGTERM)  # a node drain: the pod gets SIGTERM
            output, _ = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
        assert process.returncode == 0, output
        assert "checkpoint saved" in output and "Traceback" not in output, output
        saved = Checkpoint(path).load()
        assert isinstance(saved, RunState)
        assert saved.frames >= status["frames"] and saved.updates >= status["updates"]
        assert saved.policy_version >= status["policy_version"]
        if first is None:
            first = saved
        else:  # the second run went on from the first one's counts and versions
            assert f"run restored from {path}: {first.frames} frames" in output, output
            assert saved.frames > first.frames and saved.policy_version > first.policy_version


def test_slow_and_oversized_clients_do_not_stall_collection(tmp_path: Path) -> None:
    """20 clients dripping a control request's headers a byte at a time, 5 whose body
    never comes, and 64 KiB of headers: the service (uvicorn, one event loop with the
    collector) keeps yielding batches and answering /status while they hang."""
    (tmp_path / "token").write_text("t0ken")
    port = _free_port()
    env = {**os.environ, **SMALL, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "examples.service", "--port", str(port),
         "--control-token-file", str(tmp_path / "token")], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    attackers: list[socket.socket] = []
    try:
        before = _poll(port, process, version=1, frames=0)["batches"]
        dripping = [_connect(port, b"POST /pause HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ")
                    for _ in range(20)]
        bodiless = [_connect(port, b"POST /weights HTTP/1.1\r\nHost: x\r\nAuthorization: "
                             b"Bearer t0ken-no\r\nContent-Length: 1000000000\r\n\r\nab")
                    for _ in range(5)]
        attackers += dripping + bodiless
        with _connect(port, b"POST /pause HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                      + b"a" * (1 << 16)) as huge:
            assert huge.recv(64).startswith(b"HTTP/1.1 400"), "h11 bounds the headers"
        deadline, drips, batches = time.monotonic() + LIMIT, 0, before
        # Ten batches while every slow client hangs, over at least 40 rounds of drips.
        while batches < before + 10 or drips < 40:
            assert time.monotonic() < deadline, f"{batches - before} batches during the attack"
            for client in dripping:
                client.sendall(b"a")  # raises if the service dropped it: the attack is live
            drips += 1
            batches = _get(f"http://127.0.0.1:{port}/status")["batches"]
            time.sleep(0.05)
        assert drips > 1 and process.poll() is None
        for client in bodiless:  # answered without reading the body it never got
            assert client.recv(64).startswith(b"HTTP/1.1 401")
    finally:
        for client in attackers:
            client.close()
        process.send_signal(signal.SIGTERM)
        try:
            output, _ = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
    assert process.returncode == 0 and "Traceback" not in output, output


def _connect(port: int, data: bytes) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port), timeout=10)
    client.sendall(data)
    return client


def _poll(port: int, process: subprocess.Popen[str], *, version: int, frames: int
          ) -> dict[str, Any]:
    """/status once the policy version reached ``version`` and frames passed ``frames``."""
    deadline = time.monotonic() + LIMIT
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[0]
        try:
            status = _get(f"http://127.0.0.1:{port}/status")
        except OSError:
            status = {}
        if status.get("policy_version", 0) >= version and status.get("frames", 0) > frames:
            return status
        time.sleep(0.2)
    raise AssertionError("the service never got there")
