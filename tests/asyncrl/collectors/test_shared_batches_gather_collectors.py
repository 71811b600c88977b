"""MultiSyncCollector gathers shared-memory shares with one copy: the same batches as the wire.

A seeded, deterministic pixel env (uint8 or float frames) runs once with
``shared_memory_batches=True`` and once with False; every batch must be bit-for-bit
the same, for ``cat_results`` "stack", 0 and -1. The statistics count where each
batch came from: a local worker's first batch over the socket, the rest through
shared memory; everything over the socket when turned off.
"""

from __future__ import annotations

from typing import Any

import anyio
import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDictBase

from asyncrl import MultiSyncCollector
from asyncrl._coordinator.round_gather import RoundGather
from asyncrl.testing import ValuePolicy

pytestmark = pytest.mark.anyio
LIMIT = 120  # spawns processes on 2 shared cores
WORKERS, ENVS, STEPS, BATCHES = 2, 2, 5, 4


class SeededPixels(gym.Env):  # type: ignore[type-arg]
    """Frames made from the reset seed and the step count: two runs see the same ones."""

    def __init__(self, dtype: str = "uint8") -> None:
        self.dtype = np.dtype(dtype)
        self.observation_space = gym.spaces.Box(0, 255, shape=(48,), dtype=self.dtype)
        self.action_space = gym.spaces.Discrete(3)
        self.base, self.steps = 0, 0

    def _frame(self) -> Any:
        return ((np.arange(48) * 3 + self.base * 11 + self.steps) % 251).astype(self.dtype)

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        if seed is not None:
            self.base = seed
        return self._frame(), {}

    def step(self, action: Any) -> Any:
        self.steps += 1
        return self._frame(), float(self.base + self.steps) / 4, self.steps % 7 == 0, False, {}


def uint8_pixels() -> SeededPixels:
    return SeededPixels("uint8")


def float_pixels() -> SeededPixels:
    return SeededPixels("float32")


async def collect(shared: bool, cat_results: Any, make_env: Any = uint8_pixels,
                  ) -> tuple[list[TensorDictBase], Any]:
    async with MultiSyncCollector(make_env, ValuePolicy(1.0), num_workers=WORKERS,
                                  envs_per_worker=ENVS,
                                  frames_per_batch=WORKERS * ENVS * STEPS,
                                  total_frames=BATCHES * WORKERS * ENVS * STEPS,
                                  cat_results=cat_results,
                                  shared_memory_batches=shared) as collector:
        await collector.set_seed(100)
        batches = [batch async for batch in collector]
        return batches, collector.statistics()


def bits(batch: TensorDictBase) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    return {str(key): (str(value.dtype), tuple(value.shape),
                       value.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
            for key, value in batch.items(include_nested=True, leaves_only=True)}


@pytest.mark.parametrize(("cat_results", "make_env"), [
    ("stack", uint8_pixels), (0, float_pixels), (-1, uint8_pixels)])
async def test_gathered_batches_are_bit_identical_to_the_wire(cat_results: Any, make_env: Any,
                                                              monkeypatch: Any) -> None:
    finished: list[bool] = []
    finish = RoundGather.finish

    def spy(self: RoundGather, shares: list[TensorDictBase]) -> TensorDictBase | None:
        batch = finish(self, shares)
        finished.append(batch is not None)
        return batch

    monkeypatch.setattr(RoundGather, "finish", spy)
    with anyio.fail_after(LIMIT):
        shared, _ = await collect(True, cat_results, make_env)
        wired, _ = await collect(False, cat_results, make_env)
    # The first round crossed the socket (assemble joined it); the others were gathered.
    assert finished == [False] + [True] * (BATCHES - 1)
    assert len(shared) == len(wired) == BATCHES
    for one, other in zip(shared, wired, strict=True):
        assert one.batch_size == other.batch_size
        assert bits(one) == bits(other)
    observation = shared[-1]["observation"]
    first, second = (observation[0], observation[1]) if cat_results == "stack" else \
        (observation[:ENVS], observation[ENVS:]) if cat_results == 0 else \
        (observation[:, :STEPS], observation[:, STEPS:])
    assert not torch.equal(first, second)  # the workers' shares differ: order is checked


async def test_statistics_count_socket_and_shared_memory_batches_exactly() -> None:
    share_bytes = None
    with anyio.fail_after(LIMIT):
        shared, stats = await collect(True, "stack")
        _, wired = await collect(False, "stack")
    share = shared[0][0]  # one worker's [envs, steps] share
    share_bytes = sum(v.numel() * v.element_size()
                      for v in share.values(include_nested=True, leaves_only=True))
    for worker in stats.workers:
        # The first batch crosses the socket; the trainer then offers the segment.
        assert (worker.socket_batches, worker.shared_memory_batches) == (1, BATCHES - 1)
        assert worker.shared_memory_bytes == (BATCHES - 1) * share_bytes
        assert 0 < worker.socket_bytes <= share_bytes  # compact on the wire: at most whole
    assert (stats.socket_batches, stats.shared_memory_batches) == (WORKERS,
                                                                  WORKERS * (BATCHES - 1))
    assert stats.shared_memory_bytes == WORKERS * (BATCHES - 1) * share_bytes
    assert stats.shared_memory_fallbacks == 0
    assert [(w.socket_batches, w.shared_memory_batches) for w in wired.workers] == \
        [(BATCHES, 0)] * WORKERS
    assert (wired.socket_batches, wired.shared_memory_batches, wired.shared_memory_bytes,
            wired.shared_memory_fallbacks) == (WORKERS * BATCHES, 0, 0, 0)
