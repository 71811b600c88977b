"""AsyncBatchedCollector with remote env hosts: `asyncrl env-worker` over tcp, checked input."""

from __future__ import annotations

import subprocess
from typing import Any

import anyio
import pytest
import torch
from tensordict import TensorDict

from asyncrl import AsyncBatchedCollector
from asyncrl._protocol import PROTOCOL, EnvLayout, Hello
from asyncrl.testing import CountingEnv, ValuePolicy, version_problems
from tests.asyncrl.counting_frames import check_counting_frames
from tests.asyncrl.worker_hosts import env_host, wait_exit
from transports import Link, generate_keys

pytestmark = pytest.mark.anyio
LIMIT = 120


def start_env_host(endpoint: str, envs: int, backend: str,
                   *extra: str) -> subprocess.Popen[str]:
    return env_host(endpoint, "asyncrl.testing:CountingEnv", backend, *extra, envs=envs)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # end to end: one backend per test
async def test_a_remote_env_host_joins_local_env_workers(anyio_backend: str) -> None:
    policy = ValuePolicy(1.0)
    batches: list[TensorDict] = []
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(
                CountingEnv, num_envs=2, policy=policy, frames_per_batch=16,
                listen="tcp://127.0.0.1:0", remote_workers=1) as collector:
            assert collector.endpoint.startswith("tcp://127.0.0.1:")
            host = start_env_host(collector.endpoint, 2, anyio_backend)
            try:
                seen_remote = False
                async for batch in collector:
                    batches.append(batch)
                    remote = batch["collector", "worker_id"] == 2  # slot after the 2 local
                    if remote.any() and not seen_remote:
                        seen_remote = True
                        policy.value.data.fill_(0.0)
                        await collector.update_policy_weights()
                    elif seen_remote and (batch["collector", "policy_version"][remote] == 1).any():
                        break
            finally:
                await collector.aclose()
                code, err = await wait_exit(host)
    assert code == 0, err
    assert collector.remote_refusals == []
    frames = torch.cat(batches, 0)
    assert set(frames["collector", "worker_id"].unique().tolist()) == {0, 1, 2}
    remote = frames[frames["collector", "worker_id"] == 2]
    # two envs on the host: trajectories (2 << 32) + 0 and + 1, each starting from a reset
    assert {(2 << 32) + 0, (2 << 32) + 1} <= set(remote["collector", "traj_ids"].tolist())
    check_counting_frames(frames, length=5)
    assert version_problems(batches, {0: 1.0, 1: 0.0}) == []
    assert (remote["collector", "policy_version"] == 1).any()


def hello(obs_shape: list[int], envs: int = 1, dtype: str = "float32") -> dict[str, Any]:
    """The one hello of an env worker (``role="env"``) whose envs give ``obs_shape``."""
    layout = EnvLayout(envs=envs, obs=[(dtype, obs_shape)], action=("int64", []))  # type: ignore[list-item]
    return Hello(protocol=PROTOCOL, name="test", host="test-host", pid=1, role="env",
                 specs=layout.to_specs()).to_body()


async def test_hostile_remote_env_workers_are_refused_and_the_run_goes_on() -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(
                CountingEnv, num_envs=1, policy=ValuePolicy(1.0), frames_per_batch=8,
                listen="tcp://127.0.0.1:0", remote_workers=2) as collector:
            async with Link(collector.endpoint, identity=b"wrong-spec",
                            heartbeat_interval=0.5) as wrong:
                await wrong.send(hello([3]), kind="hello")
                answer = await wrong.recv()
            assert answer.kind == "refuse"
            assert ("envs: this collector's observations are [('float32', [2])], the worker's "
                    "[('float32', [3])]") in answer.body["reason"]

            async with Link(collector.endpoint, identity=b"no-hello",
                            heartbeat_interval=0.5) as rude:
                await rude.send({"o0": torch.zeros(1, 2)}, kind="obs")
                answer = await rude.recv()
            assert answer.kind == "refuse"
            assert "must first send 'hello' (role 'env'), got 'obs'" in answer.body["reason"]

            async with Link(collector.endpoint, identity=b"bad-obs",
                            heartbeat_interval=0.5) as bad:
                await bad.send(hello([2]), kind="hello")
                welcome = await bad.recv()
                assert welcome.kind == "env_welcome" and welcome.body["slot"] == 1
                await bad.send({"o0": torch.zeros(1, 2)}, kind="obs")  # a good one
                answer = await bad.recv()
                assert answer.kind == "act" and answer.body["v"] == 0
                assert answer.body["a"]["action"].tolist() == [1]
                await bad.send({"o0": torch.zeros(1, 3, dtype=torch.float64)}, kind="obs")
                answer = await bad.recv()
            assert answer.kind == "refuse"
            assert ("obs message must hold exactly {'o0': float32[1, 2]}, got {'o0': "
                    "float64[1, 3]}") in answer.body["reason"]
            # the local worker's frames keep coming, the policy never saw the bad request
            batches = [await collector.__anext__() for _ in range(3)]
            assert all((b["collector", "worker_id"] == 0).all() for b in batches)
            assert len(collector.remote_refusals) == 3
            assert "float64[1, 3]" in collector.remote_refusals[-1]


async def test_a_malformed_chunk_is_refused_before_it_reaches_a_batch() -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(
                CountingEnv, num_envs=1, policy=ValuePolicy(1.0), frames_per_batch=8,
                listen="tcp://127.0.0.1:0", remote_workers=2) as collector:
            async with Link(collector.endpoint, identity=b"bad-chunk",
                            heartbeat_interval=0.5) as bad:
                await bad.send(hello([2]), kind="hello")
                welcome = await bad.recv()
                steps = welcome.body["chunk_steps"]
                chunk = TensorDict({"observation": torch.zeros(1, steps, 2)},
                                   batch_size=[1, steps])
                await bad.send(chunk, kind="chunk")
                answer = await bad.recv()
            assert answer.kind == "refuse"
            assert "chunk message: wrong entries" in answer.body["reason"]
            assert "('action',)" in answer.body["reason"]
            batches = [await collector.__anext__() for _ in range(2)]
            assert all((b["collector", "worker_id"] == 0).all() for b in batches)
            # a well-formed chunk that claims a version no answer carried
            async with Link(collector.endpoint, identity=b"forged-version",
                            heartbeat_interval=0.5) as forger:
                await forger.send(hello([2]), kind="hello")
                welcome = await forger.recv()
                # the slot the refused worker left, with a new traj tag (1 + 3 slots)
                assert (welcome.body["slot"], welcome.body["traj_tag"]) == (1, 4)
                chunk = TensorDict({}, batch_size=[1, steps])
                for path, (dtype, shape) in collector._env_hub.remote.schema(1).items():
                    chunk.set(path, torch.zeros(shape, dtype=dtype))
                chunk["collector", "traj_ids"].fill_(4 << 32)
                chunk["collector", "policy_version"].fill_(99)
                await forger.send(chunk, kind="chunk")
                answer = await forger.recv()
            assert answer.kind == "refuse"
            assert "policy_version') must be versions it was answered with (0..0), got up to 99" \
                in answer.body["reason"]
            # refused workers' slots are free again; remote_workers is how many at a time
            async with (Link(collector.endpoint, identity=b"one", heartbeat_interval=0.5) as one,
                        Link(collector.endpoint, identity=b"two", heartbeat_interval=0.5) as two,
                        Link(collector.endpoint, identity=b"late",
                             heartbeat_interval=0.5) as late):
                slots = []
                for link in (one, two):
                    await link.send(hello([2]), kind="hello")
                    welcome = await link.recv()
                    assert welcome.kind == "env_welcome"
                    slots.append(welcome.body["slot"])
                assert slots == [1, 2]
                await late.send(hello([2]), kind="hello")
                answer = await late.recv()
            assert answer.kind == "refuse"
            assert answer.body["full"]  # it may ask again once a place is free
            assert ("remote_workers: this collector takes at most 2 remote worker(s) and 2 "
                    "already joined") in answer.body["reason"]


# A host that dies is dropped (lost: its connection closed) while the local env
# workers go on: test_batched_remote_rejoin's killed-host scenario asserts exactly
# that (the refusal's text, the batches in between) before it lets a new host in.


def test_torchrls_multiprocessing_transport_is_refused_naming_what_asyncrl_offers() -> None:
    with pytest.raises(ValueError, match="policy_backend='multiprocessing' is not supported"
                       ) as info:
        AsyncBatchedCollector(CountingEnv, num_envs=1, policy=ValuePolicy(1.0),
                              frames_per_batch=8, policy_backend="multiprocessing")
    assert "server_backend='process'" in str(info.value)
    assert "MultiCollector" in str(info.value)


@pytest.mark.parametrize(("listen", "remote", "message"), [
    (None, 1, "remote_workers=1 needs listen='tcp://HOST:PORT'"),
    ("ipc:///tmp/x", 1, "listen='ipc:///tmp/x': give a tcp endpoint"),
])
def test_remote_workers_need_a_tcp_listen_endpoint(listen: str | None, remote: int,
                                                   message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        AsyncBatchedCollector(CountingEnv, num_envs=1, policy=ValuePolicy(1.0),
                              frames_per_batch=8, listen=listen, remote_workers=remote)


async def test_a_remote_env_host_joins_over_curve(anyio_backend: str, tmp_path: Any) -> None:
    keys = str(generate_keys(tmp_path / "keys"))
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(
                CountingEnv, num_envs=1, policy=ValuePolicy(1.0), frames_per_batch=8,
                listen="tcp://127.0.0.1:0", remote_workers=1, curve_keys=keys) as collector:
            host = start_env_host(collector.endpoint, 1, anyio_backend, "--keys", keys)
            try:
                async for batch in collector:
                    if (batch["collector", "worker_id"] == 1).any():
                        break
            finally:
                await collector.aclose()
                code, err = await wait_exit(host)
    assert code == 0, err
    remote = batch[batch["collector", "worker_id"] == 1]
    assert (remote["action"] == 1).all()
    check_counting_frames(batch, length=5, action=1)
