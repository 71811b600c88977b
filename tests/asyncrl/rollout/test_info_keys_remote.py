"""``info_keys`` on a remote host: the trainer's reach it in its welcome, with or without
``asyncrl worker --info-key`` (which, given, must say the same: see
tests/multihost/test_rollout_options.py for a host whose flag differs)."""

from __future__ import annotations

import subprocess
from contextlib import AbstractContextManager

import anyio
import pytest

from asyncrl import MultiSyncCollector
from tests.asyncrl.rollout.info_envs import make_step_info_env
from tests.asyncrl.rollout.test_info_keys_collectors import check_rows
from tests.asyncrl.worker_hosts import worker_host

LIMIT = 120
ENV = "tests.asyncrl.rollout.info_envs:make_step_info_env"


def remote_host(endpoint: str, *flags: str) -> AbstractContextManager[subprocess.Popen[bytes]]:
    return worker_host(endpoint, ENV, "--envs-per-worker", "2", *flags)


def remote_collector() -> MultiSyncCollector:
    return MultiSyncCollector(make_step_info_env, num_workers=0, remote_workers=1,
                              listen="tcp://127.0.0.1:0", frames_per_batch=24, envs_per_worker=2,
                              total_frames=48, info_keys=["steps", "stats"])


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # processes: once is enough
async def test_a_remote_host_sends_the_info_it_was_told_to_read() -> None:
    collector = remote_collector()
    with anyio.fail_after(LIMIT):
        async with collector:
            with remote_host(collector.endpoint, "--info-key", "steps", "--info-key", "stats"):
                batches = [b.clone() async for b in collector]
    assert len(batches) == 2
    assert sum(check_rows(b) for b in batches) >= 4  # terminal rows included


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # processes: once is enough
async def test_a_remote_host_without_the_flag_reads_the_trainers_info_keys() -> None:
    # Before, its batches lacked them and the run failed at the first one: a host
    # read only the info entries its own --info-key named. The welcome carries them now.
    collector = remote_collector()
    with anyio.fail_after(LIMIT):
        async with collector:
            with remote_host(collector.endpoint):
                batches = [b.clone() async for b in collector]
    assert len(batches) == 2
    assert sum(check_rows(b) for b in batches) >= 4
