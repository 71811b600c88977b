"""Workers started as Ray actors join a listening collector (ray extra)."""

from __future__ import annotations

import anyio
import pytest

from asyncrl import MultiSyncCollector

ray = pytest.importorskip("ray", reason="the ray extra is not installed")
from asyncrl.launch.ray import launch_workers  # noqa: E402

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    yield
    ray.shutdown()


async def test_ray_actors_collect_and_exit_when_closed(local_ray) -> None:
    with anyio.fail_after(180):
        async with MultiSyncCollector("CartPole-v1", num_workers=0, remote_workers=2,
                                      listen="tcp://127.0.0.1:0", frames_per_batch=100,
                                      total_frames=200) as collector:
            workers = launch_workers(collector.endpoint, num_workers=2, env="CartPole-v1")
            try:
                batches = [b async for b in collector]
            except BaseException:
                workers.kill()
                raise
        codes = await anyio.to_thread.run_sync(lambda: workers.wait(timeout=60))
    assert codes == [0, 0]
    assert [tuple(b.shape) for b in batches] == [(2, 50), (2, 50)]


async def test_one_ray_host_actor_per_node_runs_workers_behind_a_relay(local_ray) -> None:
    from asyncrl.launch.ray import launch_hosts

    with anyio.fail_after(180):
        async with MultiSyncCollector("CartPole-v1", num_workers=0, remote_workers=2,
                                      listen="tcp://127.0.0.1:0", frames_per_batch=100,
                                      total_frames=200) as collector:
            hosts = launch_hosts(collector.endpoint, workers_per_host=2, env="CartPole-v1")
            try:
                batches = [b async for b in collector]
                relays = {s.relay for s in collector.statistics().workers}
            except BaseException:
                hosts.kill()
                raise
        codes = await anyio.to_thread.run_sync(lambda: hosts.wait(timeout=60))
    assert codes == [0]  # one node here: one host actor
    assert len(relays) == 1 and "" not in relays  # both workers behind the node's relay
    assert [tuple(b.shape) for b in batches] == [(2, 50), (2, 50)]
