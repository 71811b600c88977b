"""The rollout run here and piece by piece: one worker's work per credit, to time or inspect."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from tensordict import TensorDictBase

from transports import encode

from .._protocol import Batch
from .envs import make_env_pool
from .loop import Rollout


class RolloutProbe:
    """A worker's work for one credit, on ``env`` and ``policy``, run here and piece by piece.

    For each credit a worker collects a batch (:meth:`collect`, into buffers it
    reuses), copies it for the message and encodes the message for ZeroMQ
    (:meth:`encode`); :meth:`credit` does all three, with the worker's own code.
    :meth:`time_env` and :meth:`time_policy` time the env alone and the policy
    alone over as many steps as a batch has (:attr:`steps`), so that a profile
    can tell env, policy and the rollout's bookkeeping apart. ``env`` and
    ``policy`` are what :class:`~asyncrl.WorkerSpec` takes (a gymnasium id or
    factory; a module, a factory or ``None`` for random actions).

    >>> with RolloutProbe("CartPole-v1", None, frames_per_batch=8, envs_per_worker=2) as probe:
    ...     probe.steps, tuple(probe.collect().shape)
    (4, (2, 4))
    """

    def __init__(self, env: Any, policy: Any = None, *, frames_per_batch: int,
                 envs_per_worker: int = 1, seed: int = 0) -> None:
        self._rollout = Rollout(make_env_pool(env, num_envs=envs_per_worker), policy,
                                frames_per_batch)
        self._rollout.set_seed(seed)
        #: env steps per batch (one step steps every env of the worker)
        self.steps: int = self._rollout.steps_per_batch
        self._request = 0

    def collect(self) -> TensorDictBase:
        """One batch, ``[envs, steps]``, viewing the rollout's buffers (valid until the next)."""
        return self._rollout.collect()

    def encode(self, frames: TensorDictBase) -> list[Any]:
        """The frames ZeroMQ gets for a batch message of ``frames`` (``frames`` not copied)."""
        self._request += 1
        return encode(Batch(self._request, frames).to_body())

    def credit(self) -> list[Any]:
        """One credit as a worker serves it: collect, copy for the message, encode."""
        return self.encode(self._rollout.collect().clone())

    def time_env(self) -> float:
        """Seconds for :attr:`steps` env steps alone (last actions; finished envs reset)."""
        pool, action = self._rollout.env_pool, self._rollout.buffers.act_np  # the last actions
        done = np.zeros(pool.num_envs, dtype=bool)
        start = time.perf_counter()
        for _ in range(self.steps):
            pool.step_inplace(action)
            if pool.any_done:  # the rollout resets finished envs at once, so do we
                np.logical_or(pool.terminated, pool.truncated, out=done)
                pool.reset_where(done)
        return time.perf_counter() - start

    def time_policy(self) -> float:
        """Seconds for :attr:`steps` policy calls alone, on the rollout's step TensorDict."""
        # The policy as the rollout calls it, on the TensorDict it reads and writes each step.
        adapter, td = self._rollout.stepped_policy, self._rollout.buffers.step_td
        with adapter.exploration():  # entered once per batch, as the rollout does
            start = time.perf_counter()
            for _ in range(self.steps):
                adapter(td)
            return time.perf_counter() - start

    def close(self) -> None:
        """Close the envs (idempotent)."""
        self._rollout.close()

    def __enter__(self) -> RolloutProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
