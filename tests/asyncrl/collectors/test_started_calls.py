"""TorchRL-named calls made without ``await`` still do their work (issue #27, item 1).

A ported TorchRL loop writes ``collector.update_policy_weights_()`` and
``collector.set_seed(0)`` without ``await``. These calls start when made: the
next batch is collected with the new weights (sync mode, in process), seeded,
reset...; a call that failed unawaited raises from the next batch; its handle
used as a result raises a TypeError naming ``await``; and Python's "coroutine
was never awaited" warning never fires (there is no coroutine).
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import torch

from asyncrl import (
    BlockingCollector,
    Collector,
    CollectorError,
    CollectorStopped,
    MultiAsyncCollector,
    MultiSyncCollector,
)
from asyncrl.collectors._started import Started
from asyncrl.testing import CountingEnv, ValuePolicy, fill_parameters, version_problems

pytestmark = pytest.mark.anyio

LIMIT = 120
FAST = {"heartbeat_interval": 0.5, "peer_timeout": 10.0}


@pytest.fixture
def no_unawaited_coroutines() -> Iterator[None]:
    """Fail on Python's "coroutine ... was never awaited" (the old silent no-op's only sign)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
        gc.collect()
    never = [str(w.message) for w in caught if "never awaited" in str(w.message)]
    assert not never, never


def versions(batch: Any) -> list[int]:
    return sorted(set(batch["collector", "policy_version"].reshape(-1).tolist()))


# -- weights --------------------------------------------------------------------------------------
@pytest.mark.usefixtures("no_unawaited_coroutines")
async def test_in_process_update_without_await_is_in_the_next_batch() -> None:
    policy = ValuePolicy(0.0)
    with anyio.fail_after(LIMIT):
        async with Collector(CountingEnv, policy, frames_per_batch=8, total_frames=40) as c:
            batches = []
            async for batch in c:
                batches.append(batch)
                fill_parameters(policy, float(len(batches) % 2))  # 1, 0, 1, 0
                c.update_policy_weights_()  # as in TorchRL: not awaited
    assert [versions(b) for b in batches] == [[0], [1], [2], [3], [4]]
    assert version_problems(batches, {v: float(v % 2) for v in range(5)}) == []


@pytest.mark.usefixtures("no_unawaited_coroutines")
async def test_sync_update_without_await_is_in_the_next_batch() -> None:
    policy = ValuePolicy(0.0)
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(CountingEnv, policy, num_workers=2, frames_per_batch=16,
                                      total_frames=64, **FAST) as c:
            batches = []
            async for batch in c:
                batches.append(batch)
                fill_parameters(policy, float(len(batches) % 2))
                c.update_policy_weights_()
                c.update_policy_weights()  # asyncrl's own name: started at the call too
            assert c.policy_version == 8
    # each batch after the calls: collected entirely with the newest weights
    assert [versions(b) for b in batches] == [[0], [2], [4], [6]]
    assert version_problems(batches, {v: float((v // 2) % 2) for v in range(0, 8, 2)}) == []


@pytest.mark.usefixtures("no_unawaited_coroutines")
async def test_async_update_without_await_reaches_every_worker() -> None:
    policy = ValuePolicy(0.0)
    with anyio.fail_after(LIMIT):
        async with MultiAsyncCollector(CountingEnv, policy, num_workers=2, frames_per_batch=8,
                                       total_frames=-1, **FAST) as c:
            first = await c.__anext__()
            fill_parameters(policy, 1.0)
            started = c.update_policy_weights_()
            seen = []
            while not seen or versions(seen[-1]) != [1]:  # in-flight batches may be older
                seen.append(await c.__anext__())
            await started  # the acks: every worker applied version 1
            assert c.weight_sender().acked_versions == {0: 1, 1: 1}
    assert versions(first) == [0]
    assert version_problems([first, *seen], {0: 0.0, 1: 1.0}) == []


async def test_an_unawaited_update_that_fails_raises_from_the_next_batch() -> None:
    with anyio.fail_after(LIMIT):
        async with Collector(CountingEnv, ValuePolicy(0.0), frames_per_batch=8) as c:
            await c.__anext__()
            c.update_policy_weights_(weights_dict={"critic": ValuePolicy(1.0)})
            # no served module open under 'critic': the update fails (a KeyError, as before)
            with pytest.raises(KeyError, match=r"^model_id='critic': this collector serves "
                               r"'policy', and no served module is open"):
                await c.__anext__()
            assert versions(await c.__anext__()) == [0]  # raised once; collection goes on


# -- seeds, resets, state -------------------------------------------------------------------------
async def _first_observations(seed: int | None, *, await_it: bool) -> torch.Tensor:
    async with Collector("CartPole-v1", frames_per_batch=16, total_frames=16) as c:
        if seed is not None:
            started = c.set_seed(seed)
            if await_it:
                assert await started == seed + 1  # the next free seed, as TorchRL's
        batch = await c.__anext__()
    return batch["observation"]


@pytest.mark.usefixtures("no_unawaited_coroutines")
async def test_set_seed_without_await_seeds_the_next_batch() -> None:
    with anyio.fail_after(LIMIT):
        unawaited = await _first_observations(3, await_it=False)
        awaited = await _first_observations(3, await_it=True)
        other = await _first_observations(4, await_it=True)
    assert torch.equal(unawaited, awaited)
    assert not torch.equal(unawaited, other)


@pytest.mark.usefixtures("no_unawaited_coroutines")
async def test_multi_set_seed_and_reset_without_await() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(CountingEnv, num_workers=2, frames_per_batch=6,
                                      total_frames=-1, **FAST) as c:
            await c.__anext__()  # 3 steps each: mid-episode (episodes of 5)
            c.set_seed(11)
            c.reset()
            batch = await c.__anext__()
            assert await c.set_seed(11) == 13  # worker 0: 11, worker 1: 12
    # reset before the batch: each worker's first frame starts an episode
    assert batch["observation"][:, 0, 0].tolist() == [0.0, 0.0]


async def test_calls_chain_in_call_order() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(CountingEnv, ValuePolicy(0.0), num_workers=1,
                                      frames_per_batch=4, total_frames=-1, **FAST) as c:
            calls = [c.update_policy_weights_() for _ in range(3)]
            state = c.state_dict()
            assert [await call for call in calls] == [None, None, None]
            assert c.policy_version == 3
            assert set(await state) == {"worker0"}


# -- misuse is loud -------------------------------------------------------------------------------
async def test_a_started_call_used_as_its_result_names_await() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(CountingEnv, num_workers=1, frames_per_batch=4,
                                      total_frames=-1, **FAST) as c:
            state = c.state_dict()
            assert isinstance(state, Started)
            with pytest.raises(TypeError, match=r"write 'await collector\.state_dict\(\.\.\.\)'"):
                state["worker0"]
            with pytest.raises(TypeError, match=r"await collector\.getattr_env"):
                if c.getattr_env("num_envs"):
                    pass
            assert await c.getattr_env("num_envs") == 1


async def test_calls_on_a_collector_that_is_not_open_fail_at_once() -> None:
    c = MultiSyncCollector(CountingEnv, num_workers=1, frames_per_batch=4, total_frames=-1,
                           start_method="spawn")
    for call in (lambda: c.update_policy_weights_(), lambda: c.set_seed(0),
                 lambda: c.reset(), lambda: c.getattr_env("num_envs")):
        with pytest.raises(CollectorError, match=r"is not open; call it inside 'async with"):
            call()
    await c.shutdown()  # never opened: nothing to release, and it is closed now
    with pytest.raises(CollectorError, match="is closed"):
        c.update_policy_weights_()


@pytest.mark.usefixtures("no_unawaited_coroutines")
async def test_shutdown_without_await_ends_iteration_and_stops_workers() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(CountingEnv, num_workers=2, frames_per_batch=8,
                                      total_frames=-1, **FAST) as c:
            pending = c.set_seed(1)
            count = 0
            async for _ in c:
                count += 1
                if count == 2:
                    c.shutdown()
            assert count == 2
            assert c._closed and c.worker_pids == []
            await pending  # it ran before the close
            with pytest.raises(CollectorError, match="is closed"):
                c.set_seed(0)
            await c.shutdown()  # idempotent


async def test_a_close_ends_calls_still_waiting() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(CountingEnv, num_workers=1, remote_workers=1,
                                      listen="tcp://127.0.0.1:0", frames_per_batch=4,
                                      total_frames=-1, **FAST) as c:
            waiting = c.set_seed(0)  # waits for the remote worker, who never comes
            await anyio.wait_all_tasks_blocked()
            await c.aclose()
            with pytest.raises(CollectorStopped, match=r"set_seed\(\) did not finish"):
                await waiting


@pytest.mark.usefixtures("no_unawaited_coroutines")
async def test_pause_without_await_holds_batches_and_plain_with_names_async_with() -> None:
    with anyio.fail_after(LIMIT):
        async with MultiSyncCollector(CountingEnv, num_workers=1, frames_per_batch=4,
                                      total_frames=-1, **FAST) as c:
            await c.__anext__()
            c.pause()
            assert c.paused  # at the call
            with anyio.move_on_after(0.5) as waited:
                await c.__anext__()
            assert waited.cancelled_caught  # held
            await c.resume()
            await c.__anext__()
            with pytest.raises(TypeError, match=r"'async with collector\.pause\(\):'"):
                with c.pause():
                    pass
            assert not c.paused  # the refused pause was undone
            await c.__anext__()


# -- the blocking facade --------------------------------------------------------------------------
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
def test_blocking_collector_waits_for_started_calls(anyio_backend: str) -> None:
    del anyio_backend  # a plain test: the facade runs its own loop
    with BlockingCollector(Collector(CountingEnv, ValuePolicy(0.0), frames_per_batch=4,
                                     total_frames=-1)) as c:
        assert c.set_seed(5) == 6  # the result, not a Started
        c.update_policy_weights_()
        c.update_policy_weights()
        assert c.policy_version == 2
        assert c.getattr_env("num_envs") == 1
        assert versions(next(iter(c))) == [2]
