"""A /dev/shm too small for a run's shared memory: a Python error in the trainer (#35.3).

Before, a 30 MB policy sent by ``SharedMemWeightSyncScheme`` on a 50 MiB /dev/shm
ended the trainer with "Bus error" (exit 135) and no Python error, and central
inference with 2 MB observations lost an env worker "killed by SIGBUS". Each
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


def test_shared_mem_weights_of_a_policy_too_big_for_dev_shm_raise_in_the_trainer() -> None:
    result = in_small_shm("""
        import json, os, anyio
        from torch import nn
        from asyncrl.weights import SharedMemWeightSyncScheme
        from transports import LocalHub
        from transports import SharedMemoryFullError

        policy = nn.Linear(2800, 2800)  # 31 MB of float32, on a 16 MiB /dev/shm

        async def main():
            hub = LocalHub(encode=True)
            sender = SharedMemWeightSyncScheme().init_on_sender(
                "policy", hub=hub, model=policy, workers={0: b"w0"})
            hub.connect(b"w0")
            try:
                await sender.send_async()
            except SharedMemoryFullError as exc:
                return str(exc)
            finally:
                await sender.aclose()
            return None

        message = anyio.run(main)
        print(json.dumps({"message": message, "left": os.listdir("/dev/shm")}))
    """, size="16m")
    assert result["message"] is not None, "a 31 MB block was made on a 16 MiB /dev/shm"
    assert "/dev/shm is too small" in result["message"]
    assert "--shm-size" in result["message"] and result["left"] == []


def test_central_inference_with_observations_too_big_for_dev_shm_fails_at_open() -> None:
    result = in_small_shm("""
        import json, os, anyio
        from asyncrl.collectors import AsyncBatchedCollector
        from tests.chaos.test_full_dev_shm import big_observation_env

        async def main():
            collector = AsyncBatchedCollector(big_observation_env, frames_per_batch=8,
                                              total_frames=16, num_envs=2)
            try:
                async with collector:
                    async for _ in collector:
                        pass
            except Exception as exc:
                return type(exc).__name__, str(exc)
            return None, None

        kind, message = anyio.run(main)
        print(json.dumps({"kind": kind, "message": message, "left": os.listdir("/dev/shm")}))
    """, size="8m", timeout=240)
    assert result["kind"] == "SharedMemoryFullError", result
    assert "/dev/shm is too small" in result["message"] and "sizeLimit" in result["message"]
    assert result["left"] == []
