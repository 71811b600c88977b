"""The Atari workload of benchmarks/atari.py, in a module without torch.

An env worker of central inference that is given ``"benchmarks.atari_env:make_atari"``
imports this module, and nothing here imports torch: the worker stays torch-free
(docs/inference.md, memory). ``benchmarks.atari`` imports torch at its top.
"""

from __future__ import annotations

from typing import Any

ENV_ID = "ALE/Breakout-v5"


def make_atari() -> Any:
    """Breakout, preprocessed and stacked as CleanRL's gymnasium Atari scripts do."""
    import ale_py
    import gymnasium as gym
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    gym.register_envs(ale_py)
    env = gym.make(ENV_ID, frameskip=1)
    env = AtariPreprocessing(env, frame_skip=4, screen_size=84, grayscale_obs=True,
                             noop_max=30)
    return FrameStackObservation(env, 4)
