"""``compact_obs=True`` in real collectors: workers drop the ``("next", K)`` twins themselves.

The batches are bit-identical to dropping the twins from the whole batches the
same run would give without ``compact_obs`` (episodes that terminate and that are
truncated, sync and async, shared memory and the socket, both backends), and a
local worker's shared-memory segment holds no twin: its layout is the dropped one.
"""

from __future__ import annotations

import glob
import logging
import os
from typing import Any

import anyio
import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDictBase

from asyncrl import MultiCollector
from asyncrl._protocol import drop_twins
from asyncrl.testing import ValuePolicy
from transports import SharedTensorBlock

pytestmark = pytest.mark.anyio
LIMIT = 120  # spawns processes on 2 shared cores
BATCHES = 4  # per worker in async mode, in all in sync mode
WIDE = 64  # 512 bytes of float64 per observation: compact batches compact it


class EpisodesEnv(gym.Env):
    """Observation ``[step in episode, episode, steps so far, ...]``, each run the same.

    Even episodes terminate after 4 steps, odd ones are truncated after 3: both kinds
    of end, with a terminal observation that is not the next step's.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-1.0, float(1 << 20), shape=(WIDE,),
                                                dtype=np.float64)
        self.action_space = gym.spaces.Discrete(2)
        self._t, self._episode, self._steps = 0, -1, 0

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self._t, self._episode = 0, self._episode + 1
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self._t += 1
        self._steps += 1
        odd = self._episode % 2 == 1
        return self._obs(), float(self._steps), not odd and self._t >= 4, odd and self._t >= 3, {}

    def _obs(self) -> np.ndarray:
        obs = np.full(WIDE, float(self._steps), dtype=np.float64)
        obs[:2] = self._t, self._episode
        return obs


def episodes_env() -> EpisodesEnv:
    return EpisodesEnv()


def keys_of(batch: TensorDictBase) -> set[Any]:
    return {k if isinstance(k, tuple) else (k,)
            for k in batch.keys(include_nested=True, leaves_only=True)}


def segments() -> set[str]:
    return set(glob.glob(f"/dev/shm/asyncrl_{os.getpid()}_*"))


async def collect(*, sync: bool, shared: bool, compact_obs: bool
                  ) -> tuple[dict[tuple[int, int], TensorDictBase], list[int]]:
    """Each worker's batches by (worker, its count), and the tensors per live segment."""
    batches: dict[tuple[int, int], TensorDictBase] = {}
    tensors: list[int] = []
    with anyio.fail_after(LIMIT):
        async with MultiCollector(episodes_env, ValuePolicy(0.0), sync=sync, num_workers=2,
                                  envs_per_worker=2, frames_per_batch=24, total_frames=-1,
                                  shared_memory_batches=shared,
                                  compact_obs=compact_obs) as collector:
            # Async: which worker comes first varies; each one's k-th batch does not.
            async for batch in collector:
                worker = int(batch["collector", "worker_id"].reshape(-1)[0]) if not sync else 0
                count = sum(1 for key in batches if key[0] == worker)
                if count < BATCHES:
                    batches[(worker, count)] = batch.clone()
                if len(batches) == BATCHES * (1 if sync else 2):
                    break
            for name in segments():  # alive until the collector closes
                block = SharedTensorBlock.attach(os.path.basename(name))
                tensors.append(len(block.layout) - 1)  # its "held" word aside
                block.close()
    return batches, tensors


@pytest.mark.parametrize("shared", [True, False], ids=["shm", "socket"])
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_workers_drop_the_twins_and_the_batches_are_bit_identical(
        anyio_backend: str, sync: bool, shared: bool, caplog: pytest.LogCaptureFixture) -> None:
    full, _ = await collect(sync=sync, shared=shared, compact_obs=False)
    with caplog.at_level(logging.WARNING, logger="asyncrl"):
        dropped, tensors = await collect(sync=sync, shared=shared, compact_obs=True)
    assert "socket" not in caplog.text and "bad batch" not in caplog.text  # no fallback
    assert set(dropped) == set(full)
    ends = {flag: sum(int(b["next", flag].sum()) for b in full.values())
            for flag in ("terminated", "truncated")}
    assert ends["terminated"] > 0 and ends["truncated"] > 0
    for key, batch in full.items():
        expected = drop_twins(batch)
        assert keys_of(dropped[key]) == keys_of(expected) == keys_of(batch) - {
            ("next", "observation")}
        for leaf in keys_of(expected):
            a, b = dropped[key][leaf], expected[leaf]
            assert a.dtype == b.dtype and a.shape == b.shape, leaf
            assert torch.equal(a, b), leaf
    # The workers' segments were made from their dropped first batch: no twin in them.
    assert tensors == ([len(keys_of(next(iter(dropped.values()))))] * 2 if shared else [])
