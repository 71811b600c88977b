"""Weights through Ray's object store to workers Ray started (ray extra; issue #39).

A local Ray cluster of two raylets: the trainer (the driver) on the head, the
workers on the second raylet (its ``env_host`` resource), so every version
crosses from one raylet's object store to the other's. One cluster for the
module: starting one costs seconds.
"""

from __future__ import annotations

import os
import signal

import anyio
import pytest

from asyncrl import MultiSyncCollector, WorkerLostError
from asyncrl.testing import ValuePolicy, frame_identity_problems, identity_env, version_problems

ray = pytest.importorskip("ray", reason="the ray extra is not installed")
from asyncrl.launch._ray_handle import actor_info  # noqa: E402
from asyncrl.launch.ray import launch_workers  # noqa: E402
from asyncrl.weights import RayWeightSender, RayWeightSyncScheme  # noqa: E402
from tests.multihost.ray_cluster import two_raylets  # noqa: E402

# One local Ray cluster at a time: the Ray tests share an xdist group.
pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("ray")]

ENV = "asyncrl.testing:IdentityEnv"
POLICY = "asyncrl.testing:ValuePolicy"


@pytest.fixture(scope="module")
def local_ray():
    yield from two_raylets(env_hosts=2)


def _collector(policy: ValuePolicy, **kwargs):
    return MultiSyncCollector(
        identity_env, policy, num_workers=0, remote_workers=2, listen="tcp://127.0.0.1:0",
        frames_per_batch=20, weight_sync_schemes={"policy": RayWeightSyncScheme(timeout=60)},
        heartbeat_interval=0.5, **kwargs)


def _launch(collector, **kwargs):
    return launch_workers(collector.endpoint, num_workers=2, env=ENV, policy=POLICY,
                          resources={"env_host": 1}, **kwargs)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # end to end: one backend per test
async def test_every_frame_acts_with_the_weights_of_its_stamped_version(local_ray) -> None:
    """Each batch, a new value is sent through the object store: every frame's action
    is the value of the version it is stamped with, and the trainer keeps the refs of
    the latest version only once each send is acked."""
    policy = ValuePolicy(0.0)
    values: dict[int, float | None] = {0: 0.0}
    batches = []
    with anyio.fail_after(180):
        async with _collector(policy, total_frames=200) as collector:
            async with _launch(collector, peer_timeout=60):
                sender = collector.weight_sender("policy")
                async for batch in collector:
                    batches.append(batch)
                    policy.value.data.fill_(collector.policy_version + 1)
                    await collector.update_policy_weights()
                    values[collector.policy_version] = policy.value.item()
                assert isinstance(sender, RayWeightSender)
                assert sender.acked_versions == {0: sender.version, 1: sender.version}
                assert sender.refs_held == 1  # superseded and acked: freed
    assert not version_problems(batches, values)
    assert [int(b["collector", "policy_version"].max()) for b in batches] == list(range(10))
    assert {int(a) for b in batches[1:] for a in b["action"].flatten()} <= set(range(1, 10))


@pytest.mark.parametrize("anyio_backend", ["trio"])  # end to end: one backend per test
async def test_a_killed_actor_is_reported_as_a_lost_worker(local_ray) -> None:
    policy = ValuePolicy(0.0)
    with anyio.fail_after(180):
        async with _collector(policy, total_frames=-1) as collector:
            async with _launch(collector, max_restarts=0, peer_timeout=60) as workers:
                killed = None
                with pytest.raises(WorkerLostError) as lost:
                    async for _ in collector:
                        if collector.policy_version == 2:
                            killed = actor_info(workers.actors[0])["Pid"]
                            os.kill(killed, signal.SIGKILL)
                        policy.value.data.fill_(collector.policy_version + 1)
                        await collector.update_policy_weights()
    # Worker ids follow the order of joining, not the actors' order: the lost
    # worker is named by the killed actor's pid.
    assert f"pid {killed} on " in str(lost.value), str(lost.value)
    assert "closed its connection without a word" in str(lost.value)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_restarted_actor_rejoins_with_the_latest_version(local_ray) -> None:
    """SIGKILL one actor: Ray restarts it, it joins as a new worker and fetches the
    latest version from the object store before its first frame."""
    total = 400
    policy = ValuePolicy(0.0)
    values: dict[int, float | None] = {0: 0.0}
    batches = []
    with anyio.fail_after(240):
        async with _collector(policy, total_frames=total, on_worker_loss="wait",
                              peer_timeout=60) as collector:
            async with _launch(collector, peer_timeout=60, join_timeout=60) as workers:
                killed = None
                async for batch in collector:
                    batches.append(batch)
                    if len(batches) == 3:
                        killed = actor_info(workers.actors[0])["Pid"]
                        os.kill(killed, signal.SIGKILL)
                    policy.value.data.fill_(collector.policy_version + 1)
                    await collector.update_policy_weights()
                    values[collector.policy_version] = policy.value.item()
                new_pid = actor_info(workers.actors[0]).get("Pid")
    problems = frame_identity_problems(batches, from_start=True) + version_problems(batches,
                                                                                    values)
    assert not problems, problems[:10]
    assert sum(b.numel() for b in batches) == total
    pids = {int(p) for b in batches[3:] for p in b["next", "observation"][..., 0].flatten()}
    assert new_pid != killed and new_pid in pids, "the restarted actor delivered no frame"


@pytest.mark.parametrize("anyio_backend", ["trio"])  # end to end: one backend per test
async def test_workers_of_a_ray_host_actor_fetch_by_reference_too(local_ray) -> None:
    """``launch_hosts``: one actor spawns the node's workers (not Ray workers themselves);
    they join the cluster to fetch each version, and every frame keeps its version."""
    from asyncrl.launch.ray import launch_hosts

    policy = ValuePolicy(0.0)
    values: dict[int, float | None] = {0: 0.0}
    batches = []
    with anyio.fail_after(180):
        async with _collector(policy, total_frames=120) as collector:
            async with launch_hosts(collector.endpoint, workers_per_host=2, env=ENV,
                                    policy=POLICY, resources={"env_host": 1},
                                    peer_timeout=60):
                async for batch in collector:
                    batches.append(batch)
                    policy.value.data.fill_(collector.policy_version + 1)
                    await collector.update_policy_weights()
                    values[collector.policy_version] = policy.value.item()
    assert not version_problems(batches, values)
    assert [int(b["collector", "policy_version"].max()) for b in batches] == list(range(6))
