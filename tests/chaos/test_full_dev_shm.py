"""A /dev/shm too small for a run's shared memory: never a SIGBUS (#35.3).

Before, a 30 MB policy sent by ``SharedMemWeightSyncScheme`` on a 50 MiB /dev/shm
ended the trainer with "Bus error" (exit 135) and no Python error, and central
inference with 2 MB observations lost an env worker "killed by SIGBUS". Then both
raised :class:`SharedMemoryFullError` at creation. Since #43.6 their blocks are
sealed memfds (``transports/_shm_segment.py``), which do not live in /dev/shm at all: both
runs work on a /dev/shm too small for them, and leave nothing there. (A /dev/shm
segment that does not fit is still refused at creation: ``test_shm_full.py``.) Each
case runs a trainer in a mount namespace with a small /dev/shm of its own
(``tests/transports/test_shm_full.py``: skipped where mounting is refused).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from tests.transports.test_shm_full import in_small_shm

OBS_SHAPE = (512, 1024)  # 2 MiB of float32, as in the issue


class BigObservationEnv(gym.Env):  # type: ignore[type-arg]
    """Observations of 2 MiB; nothing else happens."""

    observation_space = gym.spaces.Box(-1, 1, OBS_SHAPE, np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        return np.zeros(OBS_SHAPE, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        return np.zeros(OBS_SHAPE, np.float32), 0.0, False, False, {}


def big_observation_env() -> BigObservationEnv:
    return BigObservationEnv()


def test_shared_mem_weights_of_a_policy_bigger_than_dev_shm_are_sent_whole() -> None:
    result = in_small_shm("""
        import json, os, anyio, torch
        from torch import nn
        from asyncrl.weights import SharedMemWeightSyncScheme
        from transports import LocalHub

        policy = nn.Linear(2800, 2800)  # 31 MB of float32, on a 16 MiB /dev/shm
        torch.nn.init.constant_(policy.weight, 0.5)

        async def main():
            hub = LocalHub(encode=True)
            sender = SharedMemWeightSyncScheme().init_on_sender(
                "policy", hub=hub, model=policy, workers={0: b"w0"})
            hub.connect(b"w0")
            try:
                version = await sender.send_async()
                block = sender.block
                _, held = block.read(*block.latest()[:2])
                return version, float(held["weight"].sum()), block.sealed
            finally:
                await sender.aclose()

        version, total, sealed = anyio.run(main)
        print(json.dumps({"version": version, "total": total, "sealed": sealed,
                          "left": os.listdir("/dev/shm")}))
    """, size="16m")
    assert result == {"version": 1, "total": 0.5 * 2800 * 2800, "sealed": True, "left": []}


def test_central_inference_with_observations_bigger_than_dev_shm_collects() -> None:
    result = in_small_shm("""
        import json, os, anyio
        from asyncrl.collectors import AsyncBatchedCollector
        from tests.chaos.test_full_dev_shm import OBS_SHAPE, big_observation_env

        async def main():
            collector = AsyncBatchedCollector(big_observation_env, frames_per_batch=8,
                                              total_frames=16, num_envs=2)
            frames = 0
            async with collector:
                async for batch in collector:
                    frames += batch.numel()
                    assert tuple(batch["observation"].shape[-2:]) == OBS_SHAPE
            return frames

        frames = anyio.run(main)
        print(json.dumps({"frames": frames, "left": os.listdir("/dev/shm")}))
    """, size="8m", timeout=240)
    assert result == {"frames": 16, "left": []}
