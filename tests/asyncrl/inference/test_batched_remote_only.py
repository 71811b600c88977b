"""AsyncBatchedCollector with remote env hosts only (``num_envs=0``), on either server.

Real ``asyncrl env-worker`` processes step :class:`IdentityEnv` envs (each frame
names its process, env and step), so ``frame_identity_problems`` proves that no
frame was lost or repeated, and :class:`ValuePolicy` makes every frame's action
show the weights that chose it (``version_problems``). The hosts have rows in
``statistics()`` and their joins, departures and losses are events, whether the
policy is served from a thread or from the dedicated inference process.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from typing import Any

import anyio
import pytest
import torch
from tensordict import TensorDict

from asyncrl import AsyncBatchedCollector
from asyncrl._observe.events import CollectorEvent
from asyncrl.testing import IdentityEnv, ValuePolicy, frame_identity_problems, version_problems
from tests.asyncrl.worker_hosts import ROOT, wait_exit

pytestmark = pytest.mark.anyio
LIMIT = 120
FPB = 32


def start_identity_host(endpoint: str, envs: int, backend: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "env-worker", "--connect", endpoint,
         "--env", "asyncrl.testing:IdentityEnv", "--envs", str(envs), "--backend", backend],
        env=env, stderr=subprocess.PIPE, text=True)


def check_frames(batches: list[TensorDict], pids: set[int], values: dict[int, float]) -> None:
    assert all(b.numel() == FPB for b in batches)
    assert frame_identity_problems(batches) == []
    assert version_problems(batches, values) == []  # type: ignore[arg-type]
    frames = torch.cat(batches, 0)
    seen = set(frames["next", "observation"][:, 0].long().tolist())
    assert seen <= pids, (seen, pids)


# End to end (two env host processes): each server on one backend, the other pairing
# than the test below, so each server meets each backend once.
@pytest.mark.parametrize(("anyio_backend", "server_backend"),
                         [("asyncio", "thread"), ("trio", "process")])
async def test_remote_env_hosts_alone_collect_exact_frames_with_the_latest_weights(
        anyio_backend: str, server_backend: str) -> None:
    policy = ValuePolicy(0.0)
    batches: list[TensorDict] = []
    collector = AsyncBatchedCollector(
        IdentityEnv, num_envs=0, policy=policy, frames_per_batch=FPB, total_frames=40 * FPB,
        listen="tcp://127.0.0.1:0", remote_workers=2, server_backend=server_backend)
    assert collector.num_workers == 0
    events = collector.events()
    hosts: list[subprocess.Popen[str]] = []
    with anyio.fail_after(LIMIT):
        async with collector:
            hosts = [start_identity_host(collector.endpoint, 2, anyio_backend) for _ in range(2)]
            try:
                while len(collector.statistics().workers) < 2:  # both joined: neither may
                    await anyio.sleep(0.05)  # find the run over when it comes (fail_after)
                updated_at = None
                async for batch in collector:
                    batches.append(batch)
                    slots = set(torch.cat(batches, 0)["collector", "worker_id"].tolist())
                    if updated_at is None and slots == {0, 1}:
                        policy.value.data.fill_(1.0)
                        await collector.update_policy_weights()
                        assert collector.policy_version == 1
                        updated_at = len(batches)
                        rows = collector.statistics().workers
                if server_backend == "process":
                    assert collector.inference_pid is not None
            finally:
                await collector.aclose()
                exits = [await wait_exit(h) for h in hosts]
    assert [code for code, _ in exits] == [0, 0], exits
    pids = {h.pid for h in hosts}
    assert sum(b.numel() for b in batches) == 40 * FPB  # total_frames, exactly
    check_frames(batches, pids, {0: 0.0, 1: 1.0})
    # after the update every host acts with the new weights
    late = torch.cat(batches[updated_at + 2:], 0) if updated_at is not None else None
    assert late is not None and late.numel()
    assert set(late["collector", "worker_id"][
        late["collector", "policy_version"] == 1].tolist()) == {0, 1}
    assert {(r.index, r.name, r.host, r.pid) for r in rows} == {
        (slot, f"env-{slot}", socket.gethostname(), pid)
        for slot, pid in zip(sorted(r.index for r in rows), [r.pid for r in sorted(
            rows, key=lambda r: r.index)], strict=True)}
    assert {r.pid for r in rows} == pids and {r.state for r in rows} == {"collecting"}
    assert all(r.frames > 0 and r.batches > 0 for r in rows)
    seen = [e async for e in events]
    joined = [e for e in seen if e.kind == "joined"]
    assert {(e.worker, e.pid, e.host) for e in joined} == {
        (r.index, r.pid, socket.gethostname()) for r in rows}
    assert [e for e in seen if e.kind in ("lost", "left", "refused")] == []


async def wait_event(events: Any, kind: str, seen: list[CollectorEvent]) -> CollectorEvent:
    async for event in events:
        seen.append(event)
        if event.kind == kind:
            return event
    raise AssertionError(f"the collector closed before a {kind!r} event; saw {seen}")


# End to end (three env host processes): each server on one backend.
@pytest.mark.parametrize(("anyio_backend", "server_backend"),
                         [("asyncio", "process"), ("trio", "thread")])
async def test_a_departed_and_a_killed_env_host_are_told_apart_and_a_newcomer_takes_over(
        anyio_backend: str, server_backend: str) -> None:
    policy = ValuePolicy(0.0)
    batches: list[TensorDict] = []
    seen: list[CollectorEvent] = []
    collector = AsyncBatchedCollector(
        IdentityEnv, num_envs=0, policy=policy, frames_per_batch=FPB,
        listen="tcp://127.0.0.1:0", remote_workers=2, server_backend=server_backend,
        heartbeat_interval=0.25, peer_timeout=30)  # a loss seen by silence would take 30 s
    events = collector.events()
    hosts: list[subprocess.Popen[str]] = []
    newcomer: subprocess.Popen[str] | None = None
    replaced = anyio.Event()
    rows: dict[str, Any] = {}

    async def script() -> None:
        nonlocal newcomer
        first = {(await wait_event(events, "joined", seen)).pid for _ in range(2)}
        assert first == {h.pid for h in hosts}
        while not all(r.batches for r in collector.statistics().workers):
            await anyio.sleep(0.05)  # (bounded by the test's fail_after) both have sent
        hosts[0].send_signal(signal.SIGTERM)  # a departure: it says goodbye
        left = await wait_event(events, "left", seen)
        assert left.pid == hosts[0].pid and "goodbye" in left.reason
        hosts[1].kill()  # a loss: its connection closes at once
        lost = await wait_event(events, "lost", seen)
        assert lost.pid == hosts[1].pid and "connection closed" in lost.reason, lost
        rows["gone"] = collector.statistics().workers
        newcomer = start_identity_host(collector.endpoint, 3, anyio_backend)
        joined = await wait_event(events, "joined", seen)
        assert joined.pid == newcomer.pid
        replaced.set()

    with anyio.fail_after(LIMIT):
        async with collector:
            hosts = [start_identity_host(collector.endpoint, 2, anyio_backend) for _ in range(2)]
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(script)
                    updated = False
                    async for batch in collector:
                        batches.append(batch)
                        if replaced.is_set() and not updated:
                            policy.value.data.fill_(1.0)
                            await collector.update_policy_weights()
                            assert collector.policy_version == 1
                            updated = True
                        elif updated and newcomer is not None and bool((
                                batch["next", "observation"][:, 0] == newcomer.pid).logical_and(
                                batch["collector", "policy_version"] == 1).any()):
                            break
                    rows["end"] = collector.statistics().workers
            finally:
                await collector.aclose()
                exits = [await wait_exit(h) for h in [*hosts, *([newcomer] if newcomer else [])]]
    assert [code for code, _ in exits] == [0, -signal.SIGKILL, 0], exits
    assert newcomer is not None
    check_frames(batches, {h.pid for h in [*hosts, newcomer]}, {0: 0.0, 1: 1.0})
    gone = {r.pid: r.state for r in rows["gone"]}
    assert gone == {hosts[0].pid: "left", hosts[1].pid: "lost"}
    end = {r.pid: r for r in rows["end"]}
    assert end[newcomer.pid].state == "collecting" and end[newcomer.pid].frames > 0
    assert end[hosts[0].pid].frames > 0 and end[hosts[0].pid].heartbeat_age is None
    assert collector.remote_refusals and "connection closed" in collector.remote_refusals[-1]


def test_num_envs_zero_needs_remote_env_hosts() -> None:
    with pytest.raises(ValueError, match=r"num_envs=0 runs no local env: give remote_workers"):
        AsyncBatchedCollector(IdentityEnv, num_envs=0, policy=ValuePolicy(), frames_per_batch=8)
    with pytest.raises(ValueError, match=r"num_envs=0 \(remote env hosts only\) takes one env"):
        AsyncBatchedCollector([IdentityEnv], num_envs=0, policy=ValuePolicy(),
                              frames_per_batch=8, listen="tcp://127.0.0.1:0", remote_workers=1)
