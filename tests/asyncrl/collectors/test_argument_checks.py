"""Wrong arguments fail at construction with a message naming them, not deep inside a run."""

from __future__ import annotations

import anyio
import numpy as np
import pytest
import torch
from torch import nn

from asyncrl import Collector, CollectorError, MultiAsyncCollector, MultiSyncCollector
from asyncrl._rollout.envs import make_env_pool
from asyncrl._rollout.loop import Rollout

LIMIT = 60


def multi(cls: type = MultiSyncCollector, **options: object) -> MultiSyncCollector:
    arguments: dict[str, object] = {"num_workers": 2, "frames_per_batch": 20, "total_frames": 40}
    arguments.update(options)
    return cls("CartPole-v1", **arguments)


# -- ints -----------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
@pytest.mark.parametrize(("name", "value", "error", "message"), [
    ("num_workers", 2.0, TypeError, "num_workers must be an int >= 0, got float 2.0"),
    ("num_workers", True, TypeError, "num_workers must be an int >= 0, got bool True"),
    ("num_workers", -1, ValueError, "num_workers must be an int >= 0, got -1"),
    ("envs_per_worker", 0, ValueError, "envs_per_worker must be an int >= 1, got 0"),
    ("envs_per_worker", 2.0, TypeError, "envs_per_worker must be an int >= 1, got float"),
    ("remote_workers", -2, ValueError, "remote_workers must be an int >= 0, got -2"),
    ("remote_workers", "1", TypeError, "remote_workers must be an int >= 0, got str '1'"),
    ("prefetch", 0, ValueError, "prefetch must be an int >= 1, got 0"),
    ("prefetch", 1.5, TypeError, "prefetch must be an int >= 1, got float 1.5"),
    ("frames_per_batch", 20.0, TypeError, "frames_per_batch must be an int >= 1, got float"),
    ("frames_per_batch", 0, ValueError, "frames_per_batch must be an int >= 1, got 0"),
    ("frames_per_batch", [10, 10.0], TypeError, "frames_per_batch[1] must be an int >= 1"),
    ("total_frames", 40.0, TypeError, "total_frames must be an int"),
    ("total_frames", False, TypeError, "total_frames must be an int"),
])
def test_multi_collector_int_arguments(cls: type, name: str, value: object,
                                       error: type[Exception], message: str) -> None:
    options: dict[str, object] = {name: value}
    if name == "remote_workers":
        options["listen"] = "tcp://127.0.0.1:0"
    with pytest.raises(error) as info:
        multi(cls, **options)
    assert message in str(info.value)


def test_numpy_ints_are_ints() -> None:
    collector = multi(num_workers=np.int64(2), frames_per_batch=np.int32(20))
    assert collector.num_workers == 2 and type(collector.num_workers) is int


@pytest.mark.parametrize(("name", "value", "error", "message"), [
    ("frames_per_batch", 20.0, TypeError, "frames_per_batch must be an int >= 1, got float"),
    ("frames_per_batch", -5, ValueError, "frames_per_batch must be an int >= 1, got -5"),
    ("envs_per_worker", 0, ValueError, "envs_per_worker must be an int >= 1, got 0"),
    ("envs_per_worker", True, TypeError, "envs_per_worker must be an int >= 1, got bool"),
    ("envs_per_worker", 3, ValueError, "frames_per_batch (20) must be a multiple of "
                                       "envs_per_worker (3)"),
    ("total_frames", 40.5, TypeError, "total_frames must be an int"),
])
def test_in_process_collector_int_arguments(name: str, value: object, error: type[Exception],
                                            message: str) -> None:
    options: dict[str, object] = {"frames_per_batch": 20, "total_frames": 40}
    options[name] = value
    with pytest.raises(error) as info:
        Collector("CartPole-v1", **options)
    assert message in str(info.value)


# -- on_worker_loss, cat_results ----------------------------------------------------------------
@pytest.mark.parametrize("value", ["ignore", "Raise", None, 1])
def test_on_worker_loss_is_one_of_the_known_modes(value: object) -> None:
    with pytest.raises(ValueError) as info:
        multi(on_worker_loss=value)
    text = str(info.value)
    assert f"got {value!r}" in text
    assert "'raise', 'continue', 'wait', 'restart'" in text


@pytest.mark.parametrize("value", ["raise", "continue", "wait", "restart"])
def test_known_on_worker_loss_modes_are_accepted(value: str) -> None:
    assert multi(on_worker_loss=value).on_worker_loss == value


@pytest.mark.parametrize("value", ["bogus", "Stack", 2, -3, 1.0, True])
def test_cat_results_is_checked_at_construction(value: object) -> None:
    with pytest.raises(ValueError) as info:
        multi(cat_results=value)
    assert f"got {value!r}" in str(info.value)
    assert "'stack'" in str(info.value)


@pytest.mark.parametrize(("value", "kept"), [(0, 0), (-1, -1), (1, 1), (-2, -2),
                                             ("stack", "stack"), (None, "stack")])
def test_cat_results_follows_torchrl(value: object, kept: object) -> None:
    # TorchRL's MultiSyncCollector treats cat_results=None as "stack".
    assert multi(cat_results=value).cat_results == kept


# -- single use ---------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_a_closed_in_process_collector_cannot_be_entered_again() -> None:
    collector = Collector("CartPole-v1", frames_per_batch=10, total_frames=10)
    with anyio.fail_after(LIMIT):
        async with collector:
            assert len([b async for b in collector]) == 1
        with pytest.raises(CollectorError, match=r"single-use.*make a new one"):
            async with collector:
                pass


@pytest.mark.anyio
async def test_a_closed_multi_collector_fails_at_once_without_spawning() -> None:
    collector = multi(num_workers=1, frames_per_batch=10, total_frames=10)
    with anyio.fail_after(LIMIT):
        async with collector:
            assert len([b async for b in collector]) == 1
            assert len(collector.worker_pids) == 1
        with pytest.raises(CollectorError, match=r"already entered and is closed.*single-use"):
            async with collector:
                pass
    assert collector.worker_pids == []  # its worker was stopped and no new one spawned


@pytest.mark.anyio
async def test_an_open_collector_cannot_be_entered_twice() -> None:
    with anyio.fail_after(LIMIT):
        async with Collector("CartPole-v1", frames_per_batch=10) as collector:
            with pytest.raises(CollectorError, match="is open: a collector is single-use"):
                async with collector:
                    pass


# -- float actions for integer action spaces ---------------------------------------------------
class ConstantPolicy(nn.Module):
    def __init__(self, value: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.value, self.dtype = value, dtype

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.full(observation.shape[:-1], self.value, dtype=self.dtype)


@pytest.mark.parametrize("value", [0.7, 1.0])
def test_float_actions_for_a_discrete_env_are_refused(value: float) -> None:
    pool = make_env_pool("CartPole-v1", num_envs=2)
    try:
        with pytest.raises(TypeError) as info:
            Rollout(pool, ConstantPolicy(value, torch.float32), 10)
    finally:
        pool.close()
    text = str(info.value)
    assert "Discrete(2)" in text and "dtype int64" in text
    assert f"float32 actions (e.g. {value!r})" in text
    assert "never rounds" in text


def test_an_env_pool_refuses_float_actions() -> None:
    with make_env_pool("CartPole-v1", num_envs=2) as pool:
        pool.reset(seed=0)
        with pytest.raises(TypeError, match=r"Discrete\(2\).*float64 actions \(e\.g\. 0\.7\)"):
            pool.step(np.array([0.7, 0.2]))
        pool.step(np.array([1, 0], dtype=np.int32))  # any integer dtype is fine


def test_integer_actions_of_another_width_are_fine() -> None:
    with Rollout(make_env_pool("CartPole-v1", num_envs=2), ConstantPolicy(1, torch.int32),
                 10) as rollout:
        assert rollout.collect()["action"].unique().tolist() == [1]


def test_a_policy_that_turns_to_float_actions_is_stopped() -> None:
    policy = ConstantPolicy(1, torch.int64)
    with Rollout(make_env_pool("CartPole-v1", num_envs=2), policy, 10) as rollout:
        rollout.collect()
        policy.dtype = torch.float64
        with pytest.raises(TypeError, match="float64 actions"):
            rollout.collect()


@pytest.mark.anyio
async def test_the_in_process_collector_refuses_float_actions() -> None:
    with anyio.fail_after(LIMIT), pytest.raises(TypeError, match="never rounds"):
        async with Collector("CartPole-v1", ConstantPolicy(0.7, torch.float32),
                             frames_per_batch=10) as collector:
            await collector.__anext__()
