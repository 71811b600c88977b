"""Threads per process and how local workers start (issue 11: oversubscription, start-up)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
import torch
from torch import nn

from asyncrl import BlockingCollector, Collector, MultiAsyncCollector, MultiSyncCollector
from asyncrl._spawn.child import process_alive
from asyncrl._spawn.threads import THREAD_VARIABLES, thread_environment

pytestmark = pytest.mark.anyio
LIMIT = 90


class ThreadsSeen(nn.Module):
    """Pendulum policy that remembers the torch threads and OMP variable it acted with."""

    def __init__(self) -> None:
        super().__init__()
        self.threads = -1
        self.omp = ""

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        self.threads = torch.get_num_threads()  # in the rollout thread, not only the main one
        self.omp = os.environ.get("OMP_NUM_THREADS", "")
        return torch.zeros(*observation.shape[:-1], 1)


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.fixture
def trainer_threads() -> int:
    """The trainer starts each test with 4 torch threads, whatever the machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield 4
    torch.set_num_threads(before)


@pytest.mark.parametrize("sub_threads", [1, 2])
async def test_workers_act_with_num_sub_threads(sub_threads: int, trainer_threads: int) -> None:
    kwargs = {} if sub_threads == 1 else {"num_sub_threads": sub_threads}  # 1 is the default
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector("Pendulum-v1", ThreadsSeen(), num_workers=2,
                                      frames_per_batch=8, total_frames=8, **kwargs) as c:
            async for _ in c:
                pass
            assert await c.getattr_policy("threads") == sub_threads
            # Native pools were sized before torch loaded in the worker's process.
            assert await c.getattr_policy("omp") == os.environ.get("OMP_NUM_THREADS", "1")


async def test_the_trainer_keeps_the_cores_its_local_workers_do_not_use(
        trainer_threads: int) -> None:
    with anyio.fail_after(LIMIT):
        async with MultiAsyncCollector("Pendulum-v1", None, num_workers=3,
                                       frames_per_batch=4, total_frames=4) as c:
            assert torch.get_num_threads() == trainer_threads - 3  # TorchRL's default
            async for _ in c:
                pass
        assert torch.get_num_threads() == trainer_threads  # restored at close


async def test_an_explicit_num_threads_is_the_trainers_count(trainer_threads: int) -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector("Pendulum-v1", None, num_workers=1, frames_per_batch=4,
                                      total_frames=4, num_threads=2) as c:
            assert torch.get_num_threads() == 2
            async for _ in c:
                pass
        assert torch.get_num_threads() == trainer_threads


async def test_a_trainer_with_fewer_threads_than_workers_keeps_one(trainer_threads: int) -> None:
    torch.set_num_threads(1)
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector("Pendulum-v1", None, num_workers=2, frames_per_batch=4,
                                      total_frames=4) as c:
            assert torch.get_num_threads() == 1
            async for _ in c:
                pass


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
async def test_each_start_method_collects_and_leaves_no_process(
        start_method: str, anyio_backend: str) -> None:
    if (start_method == "spawn") != (anyio_backend == "trio"):
        pytest.skip("one backend per start method: the processes are the same on both")
    with anyio.fail_after(LIMIT):
        collector = MultiSyncCollector("CartPole-v1", None, num_workers=2, frames_per_batch=8,
                                       total_frames=16, start_method=start_method)
        async with collector:
            shapes = [tuple(batch.shape) async for batch in collector]
            pids = collector.worker_pids
            parents = {_parent_of(pid) for pid in pids}
    assert shapes == [(2, 4), (2, 4)]
    assert len(pids) == 2
    if start_method == "spawn":
        assert parents == {os.getpid()}
    else:  # forked from the warm fork server, not from the trainer
        assert os.getpid() not in parents and len(parents) == 1
    assert not [pid for pid in pids if process_alive(pid)]


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"start_method": "fork"}, ValueError, "start_method='fork' is not supported"),
    ({"start_method": "threads"}, ValueError, "start_method must be one of"),
    ({"num_sub_threads": 0}, ValueError, "num_sub_threads must be an int >= 1, got 0"),
    ({"num_threads": 0}, ValueError, "num_threads must be an int >= 1, got 0"),
    ({"num_threads": 1.5}, TypeError, "num_threads must be an int"),
])
def test_thread_and_start_arguments_are_checked(kwargs: dict, error: type,
                                                message: str) -> None:
    with pytest.raises(error, match=message):
        MultiSyncCollector("CartPole-v1", None, num_workers=1, frames_per_batch=4, **kwargs)


def test_native_pool_variables_default_to_the_count_and_keep_the_users(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "3")
    values = thread_environment(2)
    assert values["OMP_NUM_THREADS"] == "2" and values["OPENBLAS_NUM_THREADS"] == "2"
    assert values["MKL_NUM_THREADS"] == "3"


STALE_POOL_THREAD = """
from concurrent.futures import ThreadPoolExecutor
import torch
from asyncrl._spawn.threads import use_torch_threads
pool = ThreadPoolExecutor(1)
pool.submit(torch.get_num_threads).result()  # the pool thread touches torch first
torch.set_num_threads(1)  # what the worker did, in its main thread only
print(pool.submit(torch.get_num_threads).result(), end=" ")
pool.submit(use_torch_threads, 1).result()
print(pool.submit(torch.get_num_threads).result())
"""


def test_a_pool_thread_that_ran_torch_before_takes_the_workers_count() -> None:
    # OpenMP keeps the count per thread: the rollout's pool thread must set its own.
    # (A fresh interpreter: whether a thread's count is stale depends on what ran before.)
    env = {**os.environ, "OMP_NUM_THREADS": "2"}  # 2 threads by default, even on 1 core
    out = subprocess.run([sys.executable, "-c", STALE_POOL_THREAD], capture_output=True,
                         text=True, timeout=120, check=True, env=env).stdout.split()
    assert out == ["2", "1"]  # stale until use_torch_threads, then the worker's count


async def test_a_fork_server_whose_socket_was_removed_is_replaced(anyio_backend: str) -> None:
    # Its socket lives in a temporary directory that a test's TMPDIR or a tmp
    # cleaner may remove: the next collector must still start its workers.
    from multiprocessing import forkserver

    if anyio_backend == "trio":
        pytest.skip("processes and sockets are the same on both backends; once is enough")

    async def parents_of_workers() -> set[int]:
        async with MultiSyncCollector("CartPole-v1", None, num_workers=1, frames_per_batch=4,
                                      total_frames=4) as c:
            async for _ in c:
                pass
            return {_parent_of(pid) for pid in c.worker_pids}

    with anyio.fail_after(LIMIT):
        server = forkserver._forkserver
        assert await parents_of_workers() == {server._forkserver_pid}
        old_server = server._forkserver_pid
        os.unlink(server._forkserver_address)
        assert await parents_of_workers() == {server._forkserver_pid}  # forked, by a new one
    assert server._forkserver_pid != old_server
    assert not process_alive(old_server)


@pytest.mark.parametrize("num_threads", [None, 2])
def test_blocking_collector_caps_the_thread_that_enters_it(num_threads: int | None,
                                                           trainer_threads: int) -> None:
    # torch keeps its thread count per thread: the cap must be on the training thread,
    # not only on the collector's event-loop thread (issue #27: 2 threads kept, run killed).
    expected = 2 if num_threads else trainer_threads - 1
    with BlockingCollector(MultiSyncCollector("Pendulum-v1", None, num_workers=1,
                                              frames_per_batch=4, total_frames=8,
                                              num_threads=num_threads)) as c:
        assert torch.get_num_threads() == expected
        assert sum(1 for _ in c) == 2
        assert torch.get_num_threads() == expected
    assert torch.get_num_threads() == trainer_threads  # restored on leaving


def test_blocking_in_process_collector_leaves_threads_alone(trainer_threads: int) -> None:
    with BlockingCollector(Collector("Pendulum-v1", frames_per_batch=4, total_frames=4)) as c:
        assert torch.get_num_threads() == trainer_threads  # no worker processes: no cap
        next(iter(c))
    assert torch.get_num_threads() == trainer_threads
