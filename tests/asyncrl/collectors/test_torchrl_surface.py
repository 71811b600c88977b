"""The rest of TorchRL 0.14's collector surface (issue #27, item 3).

``len(collector)`` (TorchRL's number of batches), ``AsyncCollector`` (one
worker process, off-policy) and ``Collector(backend="process",
num_collectors=N, sync=...)``, TorchRL's dispatcher spelling.
"""

from __future__ import annotations

import warnings
from typing import Any

import anyio
import pytest

import asyncrl
from asyncrl import (
    AsyncCollector,
    Collector,
    MultiAsyncCollector,
    MultiSyncCollector,
)
from asyncrl.collectors import NoLengthError
from asyncrl.testing import CountingEnv, ValuePolicy, fill_parameters

LIMIT = 120
SPAWN = {"start_method": "spawn"}  # built, never opened: no fork server needed


# -- len() ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("total", "per_batch", "batches"),
                         [(64, 16, 4), (16, 16, 1), (70, 16, 5)])
def test_len_is_torchrl_number_of_batches(total: int, per_batch: int, batches: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 70 frames: rounded up to whole batches, with a warning
        built = [Collector("CartPole-v1", frames_per_batch=per_batch, total_frames=total),
                 MultiSyncCollector("CartPole-v1", num_workers=2, frames_per_batch=per_batch * 2,
                                    total_frames=total * 2, **SPAWN),
                 AsyncCollector("CartPole-v1", frames_per_batch=per_batch, total_frames=total,
                                **SPAWN)]
    assert [len(c) for c in built] == [batches] * 3
    assert all(bool(c) for c in built)


def test_len_of_an_endless_collector_names_total_frames() -> None:
    collector = Collector("CartPole-v1", frames_per_batch=16)
    with pytest.raises(NoLengthError) as info:
        len(collector)
    # Python's "no len()" and TorchRL's RuntimeError, so either except clause works
    assert isinstance(info.value, TypeError) and isinstance(info.value, RuntimeError)
    assert str(info.value) == (
        "len(Collector) is its number of batches, and this one is endless (total_frames=-1): "
        "pass total_frames=N to Collector(...) for len() == ceil(N / frames_per_batch), or "
        "count the batches yourself")
    assert bool(collector)  # truth is not length


@pytest.mark.anyio
async def test_len_matches_the_batches_delivered() -> None:
    with anyio.fail_after(LIMIT):
        async with Collector(CountingEnv, frames_per_batch=6, total_frames=30) as c:
            assert len([b async for b in c]) == len(c) == 5


# -- AsyncCollector ------------------------------------------------------------------------------
def test_async_collector_is_a_one_worker_multi_async_collector() -> None:
    assert asyncrl.AsyncCollector is AsyncCollector
    c = AsyncCollector("CartPole-v1", frames_per_batch=8, **SPAWN)
    assert isinstance(c, MultiAsyncCollector) and c.sync is False
    assert (c.num_workers, c.frames_per_batch) == (1, 8)
    import inspect

    parameters = inspect.signature(AsyncCollector).parameters
    assert "num_workers" not in parameters and "frames_per_batch" in parameters


def test_async_collector_refuses_what_torchrl_s_does_not_mean() -> None:
    with pytest.raises(TypeError, match=r"^AsyncCollector\(num_workers=2\): AsyncCollector runs "
                                        r"one worker process.*MultiAsyncCollector\(num_workers=N"):
        AsyncCollector("CartPole-v1", frames_per_batch=8, num_workers=2, **SPAWN)
    with pytest.raises(TypeError, match=r"takes one env factory.*MultiAsyncCollector\(\[make_env"):
        AsyncCollector(["CartPole-v1"], frames_per_batch=8, **SPAWN)


@pytest.mark.anyio
async def test_async_collector_collects_ahead_with_versions() -> None:
    policy = ValuePolicy(0.0)
    with anyio.fail_after(LIMIT):
        async with AsyncCollector(CountingEnv, policy, frames_per_batch=5, total_frames=40,
                                  create_env_kwargs={"length": 3}) as c:
            shapes, versions = [], []
            async for batch in c:
                shapes.append(tuple(batch.batch_size))
                versions.append(int(batch["collector", "policy_version"].max()))
                assert batch["collector", "worker_id"].unique().tolist() == [0]
                assert batch["observation"][:, 0].max() <= 3  # create_env_kwargs reached it
                fill_parameters(policy, 1.0)
                await c.update_policy_weights_()
    assert shapes == [(5,)] * 8
    assert versions[0] == 0 and versions[-1] >= 6  # off-policy: at most prefetch behind


# -- Collector(backend=..., num_collectors=..., sync=...) ----------------------------------------
def build(**kwargs: Any) -> Any:
    return Collector("CartPole-v1", **{"frames_per_batch": 8, **SPAWN, **kwargs})


@pytest.mark.parametrize(("kwargs", "kind", "workers"), [
    ({"num_collectors": 2}, MultiAsyncCollector, 2),  # TorchRL: process backend, sync=False
    ({"num_collectors": 3, "sync": True, "frames_per_batch": 12}, MultiSyncCollector, 3),
    ({"backend": "process"}, MultiAsyncCollector, 1),
    ({"backend": "process", "sync": True}, MultiSyncCollector, 1),
    ({"backend": "process", "num_collectors": 2, "sync": False}, MultiAsyncCollector, 2),
])
def test_collector_dispatches_like_torchrl(kwargs: dict[str, Any], kind: type,
                                          workers: int) -> None:
    c = build(**kwargs)
    assert type(c) is kind and c.num_workers == workers


def test_collector_dispatch_keeps_env_lists_and_options() -> None:
    c = Collector([CountingEnv, CountingEnv], ValuePolicy(), backend="process",
                  frames_per_batch=8, return_same_td=False, track_traj_ids=True,
                  backend_options={"prefetch": 3, "start_method": "spawn"})
    assert (type(c), c.num_workers, c.prefetch) == (MultiAsyncCollector, 2, 3)
    direct = Collector("CartPole-v1", frames_per_batch=8, backend="direct", num_collectors=1)
    assert type(direct) is Collector


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"backend": "ray"}, ValueError,
     r"^Collector\(backend='ray'\): asyncrl has no ray backend; .*remote_workers=M\) and "
     r"'asyncrl worker --connect"),
    ({"backend": "bogus"}, ValueError,
     r"^Collector does not support backend='bogus'; expected one of \['direct', "),
    ({"num_collectors": 0}, ValueError, r"^Collector\(num_collectors=0\): .* positive integer"),
    ({"num_collectors": True}, TypeError, r"^Collector\(num_collectors=True\): .*positive"),
    ({"sync": True}, ValueError,
     r"^Collector\(sync=True\): sync chooses between worker-process collectors, and this one "
     r"is direct"),
    ({"backend": "direct", "num_collectors": 2}, ValueError,
     r"^Collector\(backend='direct', num_collectors=2\): the direct backend is one collector"),
    ({"num_collectors": 2, "backend_options": {"sync": True}}, ValueError,
     r"^backend_options contains reserved selector keys: \['sync'\]"),
    ({"num_collectors": 2, "backend_options": {"frames_per_batch": 4}}, ValueError,
     r"^backend_options duplicate top-level collector arguments: \['frames_per_batch'\]"),
    ({"num_collectors": 2, "sync": "yes"}, TypeError, r"^Collector\(sync='yes'\): sync must be"),
])
def test_collector_dispatch_refusals(kwargs: dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        build(**kwargs)


def test_collector_dispatch_checks_the_env_list_against_num_collectors() -> None:
    with pytest.raises(ValueError, match=r"^num_collectors does not match the number of "
                                         r"environment constructors: 3 != 2$"):
        Collector([CountingEnv, CountingEnv], num_collectors=3, frames_per_batch=8, **SPAWN)


@pytest.mark.anyio
async def test_a_dispatched_sync_collector_runs() -> None:
    with anyio.fail_after(LIMIT):
        async with Collector(CountingEnv, num_collectors=2, sync=True, frames_per_batch=8,
                             total_frames=16) as c:
            shapes = [tuple(b.batch_size) async for b in c]
    assert shapes == [(2, 4), (2, 4)]  # TorchRL's stacked [workers, time]
