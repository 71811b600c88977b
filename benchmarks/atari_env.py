"""The Atari workload of benchmarks/atari.py, in a module without torch.

An env worker of central inference that is given ``"benchmarks.atari_env:make_atari"``
imports this module, and nothing here imports torch: the worker stays torch-free
(docs/inference.md, memory). ``benchmarks.atari`` imports torch at its top.
"""

from __future__ import annotations

from typing import Any

# At the top, as CleanRL's scripts import them: the env workers' torch-free fork server
# imports this module once for all of them (asyncrl/_spawn/torch_free_preload.py), so
# ale-py, gymnasium's wrappers and OpenCV (which AtariPreprocessing imports) are shared.
import ale_py
import cv2  # noqa: F401 -- imported by AtariPreprocessing when it is made
import gymnasium as gym
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

ENV_ID = "ALE/Breakout-v5"


def make_atari() -> Any:
    """Breakout, preprocessed and stacked as CleanRL's gymnasium Atari scripts do."""
    gym.register_envs(ale_py)
    env = gym.make(ENV_ID, frameskip=1)
    env = AtariPreprocessing(env, frame_skip=4, screen_size=84, grayscale_obs=True,
                             noop_max=30)
    return FrameStackObservation(env, 4)


#: Environment variable naming the folder where :func:`make_timed_atari` keeps its counters.
PROFILE_DIR = "ATARI_PROFILE_DIR"
#: A timed env's counters (float64, in a file per env): steps, step CPU-s, resets, reset
#: CPU-s, and the native id of the thread that steps it.
COUNTERS = ("steps", "step_cpu_s", "resets", "reset_cpu_s", "thread")


def make_timed_atari() -> Any:
    """:func:`make_atari`, its steps and resets timed in CPU seconds of the stepping thread.

    For ``benchmarks.atari_server_profile``: the counters are stores into a file mapped in
    ``$ATARI_PROFILE_DIR`` (no system call per step), read by the profile from outside.
    """
    import os
    import threading
    import time

    import gymnasium as gym
    import numpy as np

    counters = np.memmap(os.path.join(os.environ[PROFILE_DIR], f"{os.getpid()}-{id(object())}"),
                         dtype=np.float64, mode="w+", shape=(len(COUNTERS),))
    clock = time.thread_time

    class Timed(gym.Wrapper):
        def step(self, action: Any) -> Any:
            start = clock()
            out = self.env.step(action)
            counters[1] += clock() - start
            counters[0] += 1
            counters[4] = threading.get_native_id()
            return out

        def reset(self, **kwargs: Any) -> Any:
            start = clock()
            out = self.env.reset(**kwargs)
            counters[3] += clock() - start
            counters[2] += 1
            return out

    return Timed(make_atari())
