"""A gymnasium id registered in the trainer at run time works in every worker.

Workers are forked from a fork server that never ran the trainer's ``main()``, and
a remote host runs none of its code: an id that ``main()`` registers (the user's
own ``gymnasium.register``, or a package's import such as ``ale_py``) was unknown
there ("Namespace ALE not found"). The collector records where the id comes from
(:class:`~asyncrl._rollout.env_ids.EnvIdSource`); local workers import it (and
register it) before ``gymnasium.make``, a remote host gets it, as data, in the
refusal of a hello that could not make the id, and imports it or exits naming
the package to install.
"""

from __future__ import annotations

import subprocess
import sys
import types
import uuid
from contextlib import AbstractContextManager

import anyio
import gymnasium as gym
import pytest
import torch

from asyncrl import AsyncBatchedCollector, MultiAsyncCollector, MultiSyncCollector
from asyncrl._rollout.env_ids import EnvIdSource
from tests.asyncrl.collectors.runtime_envs import CountingEnv
from tests.asyncrl.worker_hosts import worker_host

pytestmark = [pytest.mark.anyio,
              pytest.mark.parametrize("anyio_backend", ["asyncio"])]  # processes: once is enough
LIMIT = 120


def register_at_run_time(**kwargs: object) -> str:
    """A fresh id for CountingEnv, registered here only (as a user's main() does)."""
    env_id = f"AsyncrlCounting{uuid.uuid4().hex[:8]}-v0"
    gym.register(env_id, entry_point=CountingEnv, **kwargs)  # type: ignore[arg-type]
    return env_id


def remote_host(endpoint: str, env_id: str,
                *extra: str) -> AbstractContextManager[subprocess.Popen[str]]:
    return worker_host(endpoint, env_id, "--no-forward-logs", *extra, capture_stderr=True)


def observed_steps(batch: torch.Tensor) -> torch.Tensor:
    return batch["observation"].reshape(-1)


# -- local workers -----------------------------------------------------------------------------
@pytest.mark.parametrize("collector_class", [MultiSyncCollector, MultiAsyncCollector])
async def test_an_id_registered_at_run_time_collects_in_local_workers(
        collector_class: type) -> None:
    env_id = register_at_run_time(kwargs={"start": 100.0}, max_episode_steps=3)
    with anyio.fail_after(LIMIT):
        async with collector_class(env_id, num_workers=2, frames_per_batch=12,
                                   total_frames=24) as collector:
            batches = [b.clone() async for b in collector]
    batch = torch.cat([b.reshape(-1) for b in batches])
    # The registration's kwargs (start=100) and max_episode_steps (3) hold in the workers.
    assert set(observed_steps(batch).tolist()) == {100.0, 101.0, 102.0}
    assert batch["next", "truncated"].reshape(-1).sum() == batch.numel() // 3
    assert set(batch["collector", "worker_id"].reshape(-1).tolist()) == {0, 1}


async def test_an_id_registered_at_run_time_collects_in_env_workers() -> None:
    env_id = register_at_run_time(kwargs={"start": 10.0}, max_episode_steps=2)
    with anyio.fail_after(LIMIT):
        async with AsyncBatchedCollector(env_id, num_envs=2, frames_per_batch=8,
                                         total_frames=8) as collector:
            [batch] = [b.clone() async for b in collector]
    assert set(observed_steps(batch).tolist()) == {10.0, 11.0}


async def test_an_id_whose_entry_point_is_an_import_path_text() -> None:
    env_id = f"AsyncrlCounting{uuid.uuid4().hex[:8]}-v0"
    gym.register(env_id, entry_point="tests.asyncrl.collectors.runtime_envs:CountingEnv",
                 kwargs={"start": 7.0})
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(env_id, num_workers=1, frames_per_batch=4,
                                      total_frames=4) as collector:
            [batch] = [b.clone() async for b in collector]
    assert observed_steps(batch).tolist() == [7.0, 8.0, 9.0, 10.0]


# -- a remote host ----------------------------------------------------------------------------
async def test_a_remote_host_imports_where_the_trainers_id_comes_from() -> None:
    env_id = register_at_run_time(kwargs={"start": 50.0}, max_episode_steps=2)
    collector = MultiSyncCollector(env_id, num_workers=0, remote_workers=1,
                                   listen="tcp://127.0.0.1:0", frames_per_batch=4,
                                   total_frames=8)
    with anyio.fail_after(LIMIT):
        async with collector:
            with remote_host(collector.endpoint, env_id):
                batches = [b.clone() async for b in collector]
    steps = torch.cat([observed_steps(b) for b in batches]).tolist()
    assert steps == [50.0, 51.0] * 4


async def test_a_remote_host_that_cannot_import_it_exits_naming_the_module() -> None:
    # The entry point's module exists in the trainer only (made here, as a package the
    # host lacks): the host is told where the id comes from, cannot import it, and says so.
    module = types.ModuleType("asyncrl_only_in_the_trainer")
    module.CountingEnv = CountingEnv  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    env_id = f"AsyncrlCounting{uuid.uuid4().hex[:8]}-v0"
    try:
        gym.register(env_id, entry_point="asyncrl_only_in_the_trainer:CountingEnv")
        collector = MultiSyncCollector(env_id, num_workers=0, remote_workers=1,
                                       listen="tcp://127.0.0.1:0", frames_per_batch=4,
                                       total_frames=8, startup_timeout=None)
        with anyio.fail_after(LIMIT):
            async with collector:
                with remote_host(collector.endpoint, env_id) as host:
                    while host.poll() is None:
                        await anyio.sleep(0.2)
                    _, stderr = host.communicate(timeout=30)
    finally:
        del sys.modules[module.__name__]
        gym.envs.registry.pop(env_id, None)
    assert host.returncode != 0
    assert (f"the gymnasium id {env_id!r} is registered by module "
            "'asyncrl_only_in_the_trainer', which this process cannot import") in stderr
    assert "install the package that provides 'asyncrl_only_in_the_trainer'" in stderr


# -- Atari, when ale-py is installed (the atari extra) ----------------------------------------
async def test_ale_registered_in_the_trainer_collects_in_local_and_remote_workers() -> None:
    ale_py = pytest.importorskip("ale_py", reason="ale-py is not installed (the atari extra)")
    gym.register_envs(ale_py)  # what a user's main() does
    source = EnvIdSource.of("ALE/Pong-v5")
    assert source is not None and source.with_package().package == "ale-py"  # named to a host
    collector = MultiSyncCollector("ALE/Pong-v5", num_workers=1, remote_workers=1,
                                   listen="tcp://127.0.0.1:0", frames_per_batch=8,
                                   total_frames=16)
    with anyio.fail_after(LIMIT):
        async with collector:
            with remote_host(collector.endpoint, "ALE/Pong-v5"):
                batches = [b.clone() async for b in collector]
    batch = torch.cat(batches)
    assert batch["observation"].shape[-3:] == (210, 160, 3)
    assert set(batch["collector", "worker_id"].reshape(-1).tolist()) == {0, 1}


async def test_a_remote_env_worker_imports_where_the_trainers_id_comes_from() -> None:
    # Central inference's env workers pass the one admission: the refusal of a hello that
    # names the id it lacks carries where the trainer's id is registered, as it does for
    # a MultiCollector's workers (issue 47: 'asyncrl env-worker' hosts lacked it).
    env_id = register_at_run_time(kwargs={"start": 50.0}, max_episode_steps=2)
    collector = AsyncBatchedCollector(env_id, num_envs=0, remote_workers=1,
                                      listen="tcp://127.0.0.1:0", frames_per_batch=4,
                                      total_frames=8)
    with anyio.fail_after(LIMIT):
        async with collector:
            with remote_host(collector.endpoint, env_id, "--role", "env") as host:
                batches = [b.clone() async for b in collector]
                await collector.aclose()
                assert await anyio.to_thread.run_sync(host.wait) == 0
    steps = torch.cat([observed_steps(b) for b in batches]).tolist()
    assert sorted(set(steps)) == [50.0, 51.0] and len(steps) == 8
