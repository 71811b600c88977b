"""Chaos: a stranger that holds what it does not use (issue #43, attacks 4 and 5).

Raw links on 127.0.0.1 play the stranger and the honest host, so no worker process
starts: one hello that says ``group_size=4`` then leaves must not lock admission, and
progress without a batch must not hold a sync round. The rules themselves are tested
without sockets in ``tests/asyncrl/coordinator/test_host_groups.py`` and
``test_slow_workers.py``. Each scenario runs on one anyio backend (the suite covers both).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import anyio
import pytest

from asyncrl import MultiSyncCollector, WorkerLostError
from asyncrl._protocol import PROTOCOL, Collect, Hello, Leaving, Progress, Refuse, Welcome
from asyncrl._rollout.envs import make_env_pool
from asyncrl.testing import ValuePolicy, identity_env
from transports import Link

from .helpers import LIVENESS

pytestmark = [pytest.mark.anyio, pytest.mark.chaos]


def specs() -> dict[str, Any]:
    pool = make_env_pool(identity_env)
    try:
        return pool.specs.to_dict()
    finally:
        pool.close()


def grouped_hello(name: str, group: str, size: int, attempt: int = 0) -> Hello:
    return Hello(protocol=PROTOCOL, name=name, host="chaos", pid=os.getpid(), specs=specs(),
                 group=group, group_size=size, attempt=attempt)


async def answer(link: Link, attempt: int) -> Welcome | Refuse:
    """The welcome or refusal of hello ``attempt`` (weights and orders skipped)."""
    while True:
        message = await link.recv()
        if message.kind == Welcome.KIND:
            welcome = Welcome.from_body(message.body)
            if welcome.attempt == attempt:
                return welcome
        elif message.kind == Refuse.KIND:
            return Refuse.from_body(message.body)


async def join(link: Link, hello: Hello) -> int:
    """Say hello until welcomed (refused as full: again 0.25 s later); the refusals."""
    refusals = 0
    while True:
        await link.send(hello.to_body(), kind=Hello.KIND)
        reply = await answer(link, hello.attempt)
        if isinstance(reply, Welcome):
            return refusals
        assert reply.full, reply.reason
        refusals += 1
        hello.attempt += 1
        await anyio.sleep(0.25)


def remote_only(remote_workers: int, **kwargs: Any) -> MultiSyncCollector:
    return MultiSyncCollector(identity_env, ValuePolicy(0.0), num_workers=0,
                              remote_workers=remote_workers, listen="tcp://127.0.0.1:0",
                              frames_per_batch=10 * remote_workers, total_frames=1000,
                              **LIVENESS, **kwargs)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_one_hello_that_leaves_at_once_does_not_lock_admission() -> None:
    """No keys, remote_workers=4: a stranger's hello with group_size=4 is welcomed, and it
    leaves; an honest 2-worker host is then admitted at once (it was refused for 61 s)."""
    with anyio.fail_after(20):  # the held places show as this bound running out
        async with remote_only(4, on_worker_loss="continue") as c, \
                contextlib.AsyncExitStack() as links:
            stranger = await links.enter_async_context(
                Link(c.endpoint, identity="stranger", **LIVENESS))
            assert await join(stranger, grouped_hello("stranger", "evil", 4)) == 0
            await stranger.send(Leaving("bye").to_body(), kind=Leaving.KIND)
            await stranger.aclose()
            honest = [await links.enter_async_context(
                Link(c.endpoint, identity=f"honest-{i}", **LIVENESS)) for i in range(2)]
            refusals = [await join(link, grouped_hello(f"honest-{i}", "honest", 2))
                        for i, link in enumerate(honest)]
            # The stranger's departure is read before the honest hellos (one hub, in order).
            assert refusals == [0, 0], refusals
            live = {s.name for s in c.statistics().workers if s.state in ("collecting", "idle")}
            assert live == {"honest-0", "honest-1"}, c.statistics().workers


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_progress_without_a_batch_does_not_hold_a_sync_round() -> None:
    """sample_timeout=3: a worker that reports a rising step count and never sends its
    share is dropped (its count passes what its share holds) and the run fails naming
    it, instead of waiting for ever (25 s watched, before)."""
    with anyio.fail_after(30):  # a round held for ever shows as this bound running out
        async with remote_only(1, sample_timeout=3.0) as c, \
                contextlib.AsyncExitStack() as links:
            liar = await links.enter_async_context(Link(c.endpoint, identity="liar", **LIVENESS))

            async def lie() -> None:
                await join(liar, grouped_hello("liar", "", 0))
                while True:
                    message = await liar.recv()
                    if message.kind == Collect.KIND:
                        request = Collect.from_body(message.body).request
                        break
                steps = 0
                while True:
                    steps += 1
                    await liar.send(Progress(request, steps).to_body(), kind=Progress.KIND)
                    await anyio.sleep(0.5)

            async with anyio.create_task_group() as tg:
                tg.start_soon(lie)
                with pytest.raises(WorkerLostError) as lost:
                    async for _ in c:
                        pass
                tg.cancel_scope.cancel()
    assert "liar" in str(lost.value) and "its progress says 11 env steps" in str(lost.value), \
        lost.value
