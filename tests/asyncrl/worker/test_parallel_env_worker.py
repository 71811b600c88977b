"""A TorchRL ParallelEnv (or SerialEnv) as a worker's env: processes inside a worker."""

from __future__ import annotations

import functools
import os
import signal
from pathlib import Path

import anyio
import pytest
import torch

from asyncrl import MultiSyncCollector, WorkerLostError

torchrl = pytest.importorskip("torchrl", reason="the torchrl extra is not installed")
from torchrl.envs import GymEnv, ParallelEnv, SerialEnv  # noqa: E402

pytestmark = pytest.mark.anyio
LIMIT = 240


def recorded_cartpole(directory: str) -> GymEnv:
    """A CartPole that leaves its process id in ``directory`` (ParallelEnv's workers make it)."""
    Path(directory, str(os.getpid())).touch()
    return GymEnv("CartPole-v1", categorical_action_encoding=True)


def parallel_cartpoles(directory: str) -> ParallelEnv:
    return ParallelEnv(2, functools.partial(recorded_cartpole, directory))


def serial_cartpoles(directory: str) -> SerialEnv:
    return SerialEnv(2, functools.partial(recorded_cartpole, directory))


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def recorded_pids(directory: Path) -> set[int]:
    return {int(p.name) for p in directory.iterdir()}


async def all_gone(pids: set[int], timeout: float = 10.0) -> bool:
    with anyio.move_on_after(timeout):
        while any(alive(p) for p in pids):
            await anyio.sleep(0.1)
    return not any(alive(p) for p in pids)


# The ParallelEnv case starts 2 workers x 2 TorchRL env processes (each a fresh
# interpreter importing torchrl): its processes live inside the workers, which run
# whatever the trainer's backend, so it runs once; the SerialEnv case (same
# collector path, no extra processes) keeps the check on both backends.
@pytest.mark.parametrize(("anyio_backend", "make"), [
    ("asyncio", parallel_cartpoles), ("asyncio", serial_cartpoles), ("trio", serial_cartpoles)],
    ids=["asyncio-parallel_cartpoles", "asyncio-serial_cartpoles", "trio-serial_cartpoles"])
async def test_a_batched_torchrl_env_in_each_worker(tmp_path: Path, make: object) -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(make, num_workers=2, frames_per_batch=40,
                                      total_frames=80,
                                      create_env_kwargs={"directory": str(tmp_path)}) as c:
            batches = [b async for b in c]
            workers = set(c.worker_pids)
            assert await c.getattr_env("num_workers") == 2  # the user's ParallelEnv's
    assert len(batches) == 2
    for batch in batches:
        # two workers x two envs each, ten steps: [workers, envs, steps] as TorchRL stacks
        assert batch.batch_size == torch.Size([2, 2, 10])
        assert batch["collector", "worker_id"][..., 0].tolist() == [[0, 0], [1, 1]]
        assert batch["action"].dtype == torch.int64
        assert batch["observation"].shape == (2, 2, 10, 4)
        # each env is a trajectory of its own
        assert len(set(batch["collector", "traj_ids"][..., 0].reshape(-1).tolist())) == 4
    env_pids = recorded_pids(tmp_path)
    if make is parallel_cartpoles:
        assert len(env_pids - workers) >= 4  # the workers' own children stepped the envs
    else:
        assert env_pids <= workers  # SerialEnv: in the workers themselves
    assert await all_gone(env_pids | workers), "a worker or an env process outlived aclose()"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # processes only: once is enough
async def test_env_processes_of_a_killed_worker_end_by_themselves(tmp_path: Path) -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(parallel_cartpoles, num_workers=1, frames_per_batch=20,
                                      create_env_kwargs={"directory": str(tmp_path)}) as c:
            await c.__anext__()
            [worker] = c.worker_pids
            os.kill(worker, signal.SIGKILL)  # no chance to close its ParallelEnv
            with pytest.raises(WorkerLostError, match=r"worker 0 .*SIGKILL"):
                await c.__anext__()
    env_pids = recorded_pids(tmp_path) - {worker}
    assert len(env_pids) >= 2
    # TorchRL's env workers see their pipe to the dead worker close, and exit.
    assert await all_gone(env_pids, timeout=30.0), "env processes outlived their killed worker"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # processes only: once is enough
async def test_spawned_workers_may_have_children_too(tmp_path: Path) -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(parallel_cartpoles, num_workers=1, frames_per_batch=20,
                                      total_frames=20, start_method="spawn",
                                      create_env_kwargs={"directory": str(tmp_path)}) as c:
            [batch] = [b async for b in c]
            workers = set(c.worker_pids)
    assert batch.batch_size == torch.Size([1, 2, 10])
    assert await all_gone(recorded_pids(tmp_path) | workers)
