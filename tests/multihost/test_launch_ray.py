"""Workers started as Ray actors join a listening collector (ray extra).

A local Ray cluster of two raylets (two "nodes" on this machine): the second
one has a custom resource, so that node selection has something to select.
Every test closes what it launched, and closing waits (bounded) until the
actor processes are gone: the suite's leak check finds none.
"""

from __future__ import annotations

import anyio
import pytest
import torch

from asyncrl import MultiAsyncCollector, MultiSyncCollector

ray = pytest.importorskip("ray", reason="the ray extra is not installed")
from asyncrl.launch._ray_handle import actor_info  # noqa: E402
from asyncrl.launch.ray import launch_hosts, launch_workers, select_nodes  # noqa: E402
from tests.multihost.ray_cluster import two_raylets  # noqa: E402

# One local Ray cluster at a time (scripts/test.sh runs tests on several xdist
# workers): tests/deploy/test_ray_job.py starts one too, in the same group.
pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("ray")]


@pytest.fixture(scope="module")
def local_ray():
    yield from two_raylets(env_hosts=1)


def _alive_pids(workers) -> list[int]:
    pids = [actor_info(a).get("Pid") for a in workers.actors]
    return [p for p in pids if p and _running(p)]


def _running(pid: int) -> bool:
    """Whether ``pid`` is alive and not a zombie: read once, as it may exit at any moment."""
    from pathlib import Path

    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in "ZX"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # end to end: one backend per test
async def test_ray_actors_collect_and_end_when_closed(local_ray) -> None:
    with anyio.fail_after(180):
        async with MultiSyncCollector("CartPole-v1", num_workers=0, remote_workers=2,
                                      listen="tcp://127.0.0.1:0", frames_per_batch=100,
                                      total_frames=200, max_frames_per_traj=4) as collector:
            workers = launch_workers(collector.endpoint, num_workers=2, env="CartPole-v1")
            try:
                batches = [b async for b in collector]
            except BaseException:
                await workers.aclose()
                raise
        pids = [actor_info(a).get("Pid") for a in workers.actors]
        async with workers:
            outcomes = await anyio.to_thread.run_sync(lambda: workers.wait(timeout=60))
        assert all(pids)
        assert _alive_pids(workers) == []  # closing waited for the processes
    assert [o.exit_code for o in outcomes] == [0, 0]
    assert [tuple(b.shape) for b in batches] == [(2, 50), (2, 50)]
    # The trainer's rollout options reach the actors in their welcome (CartPole's
    # random episodes last about 20 steps: without the option most are longer than 4).
    ids = torch.cat([b["collector", "traj_ids"].flatten() for b in batches])
    assert int(torch.unique(ids, return_counts=True)[1].max()) <= 4


@pytest.mark.parametrize("anyio_backend", ["trio"])  # end to end: one backend per test
async def test_wait_reports_every_actor_even_a_dead_one(local_ray) -> None:
    with anyio.fail_after(180):
        async with MultiAsyncCollector("CartPole-v1", num_workers=0, remote_workers=2,
                                       listen="tcp://127.0.0.1:0", frames_per_batch=50,
                                       on_worker_loss="continue") as collector:
            with launch_workers(collector.endpoint, num_workers=2, env="CartPole-v1",
                                max_restarts=0) as workers:
                seen = set()
                async for batch in collector:
                    seen.add(int(batch["collector", "worker_id"].flatten()[0]))
                    if len(seen) == 2:
                        break
                ray.kill(workers.actors[0], no_restart=True)
                outcomes = await anyio.to_thread.run_sync(lambda: workers.wait(timeout=1))
    assert outcomes[0].exit_code is None and "Died" in outcomes[0].error, outcomes[0]
    assert outcomes[1].running, outcomes[1]  # the other one is still at work, and says so


def test_node_selection(local_ray) -> None:
    trainer = ray.get_runtime_context().get_node_id()
    every = select_nodes()
    assert len(every) == 2 and trainer in every
    others = select_nodes(exclude_trainer_node=True)
    assert others == [n for n in every if n != trainer]
    assert select_nodes(resources={"env_host": 1}) == others  # only the second raylet has it
    assert select_nodes(resources={"env_host": 2}) == []
    with pytest.raises(ValueError, match="no Ray node"):
        launch_hosts("tcp://127.0.0.1:1", workers_per_host=1, env="CartPole-v1",
                     resources={"gpu_for_sure": 1})


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # end to end: one backend per test
async def test_one_ray_host_actor_per_selected_node_runs_workers_behind_a_relay(
        local_ray) -> None:
    with anyio.fail_after(180):
        async with MultiSyncCollector("CartPole-v1", num_workers=0, remote_workers=2,
                                      listen="tcp://127.0.0.1:0", frames_per_batch=100,
                                      total_frames=200) as collector:
            hosts = launch_hosts(collector.endpoint, workers_per_host=2, env="CartPole-v1",
                                 exclude_trainer_node=True)
            try:
                batches = [b async for b in collector]
                relays = {s.relay for s in collector.statistics().workers}
            except BaseException:
                await hosts.aclose()
                raise
        async with hosts:
            outcomes = await anyio.to_thread.run_sync(lambda: hosts.wait(timeout=60))
        trainer = ray.get_runtime_context().get_node_id()
        assert [o.node for o in outcomes] != [trainer]
        assert _alive_pids(hosts) == []
    assert [o.exit_code for o in outcomes] == [0]  # the one node selected: one host actor
    assert len(relays) == 1 and "" not in relays  # both workers behind the node's relay
    assert [tuple(b.shape) for b in batches] == [(2, 50), (2, 50)]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_killed_actor_is_restarted_by_ray_and_rejoins_with_the_latest_weights(
        local_ray) -> None:
    """SIGKILL one actor's process: the collector loses it on its closed connection,
    Ray restarts it, its worker joins the free place and acts with the weights of the
    latest version from its first frame; the run's frames and total stay exact."""
    import os
    import signal

    from asyncrl.testing import (
        ValuePolicy,
        frame_identity_problems,
        identity_env,
        version_problems,
    )

    total = 600
    policy = ValuePolicy(0.0)
    values: dict[int, float | None] = {0: 0.0}
    batches = []
    with anyio.fail_after(240):
        async with MultiSyncCollector(
                identity_env, policy, num_workers=0, remote_workers=2,
                listen="tcp://127.0.0.1:0", frames_per_batch=20, total_frames=total,
                on_worker_loss="wait", heartbeat_interval=0.5, peer_timeout=60) as collector:
            async with launch_workers(collector.endpoint, num_workers=2,
                                      env="asyncrl.testing:IdentityEnv",
                                      policy="asyncrl.testing:ValuePolicy",
                                      peer_timeout=60, join_timeout=60) as workers:
                killed = None
                async for batch in collector:
                    batches.append(batch)
                    if len(batches) == 3:
                        killed = actor_info(workers.actors[0])["Pid"]
                        os.kill(killed, signal.SIGKILL)
                    policy.value.data.fill_(collector.policy_version + 1)
                    await collector.update_policy_weights()
                    values[collector.policy_version] = policy.value.item()
                restarts = actor_info(workers.actors[0]).get("NumRestarts")
                new_pid = actor_info(workers.actors[0]).get("Pid")
    problems = frame_identity_problems(batches, from_start=True) + version_problems(batches,
                                                                                    values)
    assert not problems, problems[:10]
    assert sum(b.numel() for b in batches) == total
    assert restarts == 1 and new_pid != killed
    pids = {int(p) for b in batches[3:] for p in b["next", "observation"][..., 0].flatten()}
    assert new_pid in pids, "the restarted actor delivered no frame"


@pytest.mark.parametrize("anyio_backend", ["trio"])  # end to end: one backend per test
async def test_scale_starts_a_host_on_a_node_added_while_the_run_goes_on(local_ray) -> None:
    """The run goes on with one host (on the one node with ``env_host``); that host is
    killed for good (its places free at once) and a raylet joins the cluster: ``scale()``
    starts one host there, and only there; its workers take the free places, behind a
    relay of their own, and collect."""
    def node_ids() -> set[str]:
        return {n["NodeID"] for n in ray.nodes() if n["Alive"]}

    before = node_ids()
    added = None
    try:
        with anyio.fail_after(240):
            async with MultiAsyncCollector("CartPole-v1", num_workers=0, remote_workers=2,
                                           listen="tcp://127.0.0.1:0", frames_per_batch=50,
                                           total_frames=-1, on_worker_loss="continue"
                                           ) as collector:
                hosts = launch_hosts(collector.endpoint, workers_per_host=2, env="CartPole-v1",
                                     resources={"env_host": 1}, max_restarts=0)
                try:
                    assert len(hosts.actors) == 1  # the one node with the resource
                    seen: set[int] = set()
                    async for batch in collector:
                        seen |= set(batch["collector", "worker_id"].flatten().tolist())
                        if added is None and seen == {0, 1}:
                            ray.kill(hosts.actors[0], no_restart=True)  # its workers go too
                            added = local_ray.add_node(num_cpus=2, resources={"env_host": 1})
                            local_ray.wait_for_nodes()
                            assert hosts.scale() == 1  # the new node, and only it
                            assert hosts.scale() == 0  # it has a host now
                        elif seen >= {2, 3}:
                            break
                    workers = {w.index: w for w in collector.statistics().workers}
                except BaseException:
                    await hosts.aclose()
                    raise
            async with hosts:
                outcomes = await anyio.to_thread.run_sync(lambda: hosts.wait(timeout=60))
            new = node_ids() - before
            assert len(new) == 1
            assert outcomes[0].exit_code is None and "Died" in outcomes[0].error
            assert outcomes[1].exit_code == 0 and outcomes[1].node in new  # on the added node
            assert [workers[i].state for i in range(4)][:2] == ["lost", "lost"]
            assert {workers[2].relay, workers[3].relay} - {"", workers[0].relay}, workers
            assert workers[2].relay == workers[3].relay  # the new node's relay
            assert _alive_pids(hosts) == []
    finally:
        if added is not None:
            local_ray.remove_node(added)
