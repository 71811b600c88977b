"""AsyncBatchedCollector: batch size limits, failures, shutdown and its arguments."""

from __future__ import annotations

import functools
import os
import signal
import time

import anyio
import pytest
import torch
from torch import nn

from asyncrl import AsyncBatchedCollector, WorkerLostError
from asyncrl.testing import CountingEnv, ValuePolicy, failing_env_at_step
from tests.asyncrl.process_checks import pid_alive
from tests.transports.test_shm import shm_exists

pytestmark = pytest.mark.anyio
LIMIT = 90
counting3 = functools.partial(CountingEnv, length=3)


class SlowPolicy(nn.Module):
    """Action 1 after a few ms: requests pile up while it runs."""

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        time.sleep(0.01)
        return torch.ones(observation.shape[:-1], dtype=torch.int64)


async def test_no_call_serves_more_than_max_batch_size() -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=4, policy=SlowPolicy(),
                                         max_batch_size=2, frames_per_batch=16,
                                         total_frames=64) as collector:
            _ = [b async for b in collector]
            stats = collector.inference_statistics()
    assert set(stats.batch_sizes) <= {1, 2} and 2 in stats.batch_sizes  # requests piled up
    assert stats.observations == sum(n * k for n, k in stats.batch_sizes.items()) >= 64


async def test_min_batch_size_waits_for_that_many_observations() -> None:
    # Every worker waits for its action, so all 4 requests come before each call.
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=4, policy=ValuePolicy(1.0),
                                         min_batch_size=4, server_timeout=60,
                                         frames_per_batch=16, total_frames=64) as collector:
            _ = [b async for b in collector]
            stats = collector.inference_statistics()
    assert set(stats.batch_sizes) == {4}


class SlowCountingEnv(CountingEnv):
    def step(self, action: object) -> tuple:
        time.sleep(0.05)
        return super().step(action)


async def test_min_batch_size_gives_up_after_server_timeout() -> None:
    # One env steps slowly: waiting for all three would stall the two fast ones, so
    # calls go out short once server_timeout has passed.
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector([counting3, counting3, SlowCountingEnv],
                                         policy=ValuePolicy(1.0), min_batch_size=3,
                                         server_timeout=0.001, frames_per_batch=6,
                                         total_frames=24) as collector:
            _ = [b async for b in collector]
            stats = collector.inference_statistics()
    assert min(stats.batch_sizes) < 3


async def test_a_killed_env_worker_is_reported_not_hung() -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=2, policy=ValuePolicy(1.0),
                                         frames_per_batch=6) as collector:
            await collector.__anext__()
            os.kill(collector.worker_pids[1], signal.SIGKILL)
            with pytest.raises(WorkerLostError, match=r"env worker 1 .*SIGKILL"):
                for _ in range(10_000):
                    await collector.__anext__()


async def test_an_env_error_comes_back_with_its_type_and_traceback() -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(functools.partial(failing_env_at_step, 5), num_envs=2,
                                         policy=ValuePolicy(1.0),
                                         frames_per_batch=2) as collector:
            with pytest.raises(RuntimeError, match="failed on purpose") as info:
                for _ in range(100):
                    await collector.__anext__()
    assert "CountingEnv" in "\n".join(getattr(info.value, "__notes__", []))


async def test_aclose_leaves_no_process_and_no_shared_memory() -> None:
    with anyio.fail_after(LIMIT):
        collector = AsyncBatchedCollector(counting3, num_envs=3, envs_per_worker=2,
                                          policy=ValuePolicy(1.0), frames_per_batch=6)
        async with collector:
            await collector.__anext__()
            pids = collector.worker_pids
            names = [b.name for w in collector._channels.blocks.values() for b in (w.obs, w.act)]
            assert len(pids) == 2 and all(pid_alive(p) for p in pids)
            assert len(names) == 4 and all(shm_exists(n) for n in names)
        await collector.aclose()  # idempotent
    assert not any(pid_alive(p) for p in pids)
    assert not any(shm_exists(n) for n in names)


async def test_cancelling_the_trainer_stops_every_env_worker() -> None:
    pids: list[int] = []
    with anyio.fail_after(LIMIT):
        with anyio.CancelScope() as scope:
            async with AsyncBatchedCollector(counting3, num_envs=2, policy=ValuePolicy(1.0),
                                             frames_per_batch=6) as collector:
                await collector.__anext__()
                pids = collector.worker_pids
                scope.cancel()
                await anyio.sleep(30)
    assert scope.cancelled_caught
    assert pids and not any(pid_alive(p) for p in pids)


# -- arguments (no processes) ------------------------------------------------------------------
@pytest.mark.parametrize(("name", "value", "hint"), [
    ("transport", "auto", "shared-memory slots"),
    ("server_config", object(), "max_batch_size="),
    ("weight_sync", object(), "update_policy_weights"),
    ("reset_at_each_iter", True, "MultiSyncCollector"),
    ("worker_affinity", [[0]], "taskset"),
])
def test_torchrl_only_arguments_are_refused_with_the_asyncrl_way(name, value, hint) -> None:
    with pytest.raises(TypeError, match=hint):
        AsyncBatchedCollector(counting3, num_envs=2, policy=ValuePolicy(), frames_per_batch=4,
                              **{name: value})


def test_torchrl_values_that_match_what_asyncrl_does_are_accepted() -> None:
    AsyncBatchedCollector(counting3, num_envs=2, policy=ValuePolicy(), frames_per_batch=4,
                          env_backend="multiprocessing", policy_backend="threading",
                          env_exchange="shm")
    with pytest.raises(ValueError, match="env workers are always processes"):
        AsyncBatchedCollector(counting3, num_envs=2, policy=ValuePolicy(), frames_per_batch=4,
                              env_backend="threading")


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"num_envs": None}, ValueError, "needs num_envs"),
    ({"max_batch_size": 1, "envs_per_worker": 2}, ValueError, "smaller than envs_per_worker"),
    ({"min_batch_size": 3}, ValueError, "can never be met by 2 envs"),
    ({"min_batch_size": 2, "max_batch_size": 1}, ValueError, "min_batch_size=2 > max"),
    ({"server_timeout": -1}, ValueError, "server_timeout"),
    ({"device": "cuda"}, ValueError, "no CUDA device"),
    ({"policy_factory": ValuePolicy}, TypeError, "mutually exclusive"),
    ({"frames_per_batch": 0}, ValueError, "frames_per_batch"),
    ({"bogus": 1}, TypeError, "unexpected keyword argument 'bogus'"),
])
def test_bad_arguments_fail_in_the_constructor(kwargs, error, match) -> None:
    if kwargs.get("device") == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    args = {"num_envs": 2, "policy": ValuePolicy(), "frames_per_batch": 4, **kwargs}
    with pytest.raises(error, match=match):
        AsyncBatchedCollector(counting3, **args)


async def test_update_policy_weights_refuses_worker_ids() -> None:
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=1, policy=ValuePolicy(1.0),
                                         frames_per_batch=3) as collector:
            with pytest.raises(ValueError, match="one policy"):
                await collector.update_policy_weights(worker_ids=[0])
            with pytest.raises(TypeError, match="give the weights once"):
                await collector.update_policy_weights(ValuePolicy(2.0), weights=ValuePolicy())
            await collector.update_policy_weights(weights=ValuePolicy(2.0))
            await collector.update_policy_weights(policy=ValuePolicy(3.0), model_id="policy")
            assert collector.policy_version == 2


async def test_a_batch_many_chunks_long_fits_the_workers_rings() -> None:
    # 500 frames per worker in chunks of a few steps is more chunks than a ring has
    # slots (8): the ring holds what it can and the worker waits for room; the batches
    # are whole and every trajectory counts up from 0 (it refused to open before).
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(counting3, num_envs=2, policy=ValuePolicy(1.0),
                                         frames_per_batch=1000, total_frames=2000) as collector:
            batches = [b async for b in collector]
    assert [b.batch_size for b in batches] == [torch.Size([1000])] * 2
    for batch in batches:
        steps = batch["observation"][:, 0]
        next_steps = batch["next", "observation"][:, 0]
        assert bool(((next_steps == steps + 1)).all())
        assert set(steps.tolist()) == {0.0, 1.0, 2.0}
