"""AsyncBatchedCollector records the served module's version in every frame (``info_keys``),
and each frame's reward is the one that version computed, across updates by model id:
from local env workers and from a remote env host (the info_keys reach it in its welcome)."""

from __future__ import annotations

import functools
import subprocess

import anyio
import pytest
import torch

from asyncrl import AsyncBatchedCollector
from asyncrl.served import ServedModule
from tests.asyncrl.worker_hosts import env_host, wait_exit

from .served_envs import REMOTE_NAME, Scale, checked_versions, rewarded_env

pytestmark = pytest.mark.anyio
NAME = REMOTE_NAME  # "env.transform[0]"
MAX_BATCHES = 200  # the versions show long before (a bound, not a timing)


def served_scale(clients: int) -> ServedModule:
    """Version v computes ``reward = (v + 1) * t`` (checked_versions' rule)."""
    return ServedModule(Scale(1.0), name=NAME, example={"next_observation": torch.zeros(3)},
                        clients=clients)


async def collect_across_two_updates(collector: AsyncBatchedCollector,
                                     served: ServedModule) -> list[list[int]]:
    """Every batch checked frame by frame; an update after the first batch, another once
    version 1 shows; until version 2 shows. The versions each batch held."""
    seen: list[list[int]] = []
    async for batch in collector:
        version = checked_versions(batch, NAME)  # reward == t * (version + 1), every frame
        assert version.dtype == torch.int64
        seen.append(version.unique().tolist())
        newest = max(max(v) for v in seen)
        if len(seen) == 1:
            await collector.update_policy_weights({"scale": torch.tensor([2.0])},
                                                  model_id=NAME)
        elif newest == 1 and served.version == 1:
            await collector.update_policy_weights(weights_dict={NAME: Scale(3.0)})
        elif newest == 2 or len(seen) >= MAX_BATCHES:
            break
    return seen


async def test_local_env_workers_record_the_version_of_each_frames_reward() -> None:
    with anyio.fail_after(120):
        async with served_scale(clients=4) as served:
            async with AsyncBatchedCollector(
                    functools.partial(rewarded_env, served.handle), num_envs=2,
                    frames_per_batch=32, info_keys=[served.handle.info_key]) as collector:
                seen = await collect_across_two_updates(collector, served)
                assert collector.policy_version == 0  # the policy was not touched
    assert seen[0] == [0]
    versions = sorted({v for batch in seen for v in batch})
    assert versions == [0, 1, 2], seen
    assert served.version == 2


def start_env_host(endpoint: str, backend: str) -> subprocess.Popen[str]:
    return env_host(endpoint, "tests.asyncrl.served.served_envs:remote_rewarded_env", backend)


async def test_a_remote_env_host_records_them_too(anyio_backend: str) -> None:
    with anyio.fail_after(120):
        async with served_scale(clients=4) as served:
            collector = AsyncBatchedCollector(
                functools.partial(rewarded_env, served.handle), num_envs=0,
                frames_per_batch=16, listen="tcp://127.0.0.1:0", remote_workers=1,
                info_keys=[served.handle.info_key])
            async with collector:
                host = start_env_host(collector.endpoint, anyio_backend)  # no --info-key
                try:
                    seen = await collect_across_two_updates(collector, served)
                finally:
                    await collector.aclose()
                    code, err = await wait_exit(host)
    assert code == 0, err
    assert collector.remote_refusals == []
    assert sorted({v for batch in seen for v in batch}) == [0, 1, 2], seen
    assert served.version == 2
