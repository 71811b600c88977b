"""`TorchRLPool`: a torchrl ``EnvBase`` behind the numpy pool interface (the slow path).

`asyncrl._rollout.torchrl_fast` steps the envs it can without TorchRL's
TensorDict machinery; everything else comes here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .env_pools import EnvPool
from .env_specs import ArraySpec, EnvSpecs

__all__ = ["TorchRLPool"]


class TorchRLPool(EnvPool):
    """A torchrl ``EnvBase`` (batch size ``[]`` or ``[N]``) behind the numpy interface.

    Slower than the gymnasium pools: every step goes through the env's
    TensorDict machinery and is copied into our buffers. Only flat
    observation keys, a Categorical/OneHot/Bounded/Unbounded action and one
    reward are supported; use the gymnasium env directly when you can.
    """

    #: False: every step goes through TorchRL (see `asyncrl._rollout.torchrl_fast`).
    fast_path = False
    reads_info = False  # a TorchRL env reads its own info (set_info_dict_reader)

    def __init__(self, env: Any) -> None:
        import torch

        batch = tuple(env.batch_size)
        if len(batch) > 1:
            raise ValueError(f"torchrl env batch_size must be [] or [N], got {list(batch)}")
        self._env = env
        self._batched = len(batch) == 1
        n = batch[0] if self._batched else 1
        self._obs_keys = [
            k for k in env.full_observation_spec.keys(True, True) if isinstance(k, str)
        ]
        obs_tree = {
            k: _spec_from_torchrl(env.full_observation_spec[k], batch) for k in self._obs_keys
        }
        action = _spec_from_torchrl(env.action_spec, batch)
        super().__init__(EnvSpecs(observation=obs_tree, action=action, num_envs=n))
        self._action = torch.zeros((*batch, *action.shape), dtype=_torch_dtype(action.dtype))
        self._td = env.reset()

    @property
    def user_env(self) -> Any:
        return self._env

    def _write(self, td: Any) -> None:
        for key, arr in zip(self._obs_keys, self._layout.arrays, strict=True):
            arr[...] = td.get(key).reshape(arr.shape).cpu().numpy()

    def step_inplace(self, actions: np.ndarray) -> None:
        import torch

        self._action.view(-1).copy_(torch.from_numpy(np.ascontiguousarray(actions)).view(-1))
        self._td.set(self._env.action_key, self._action)
        out = self._env.step(self._td).get("next")
        self._write(out)
        n = self.num_envs
        self.reward[:] = out.get("reward").reshape(n).float().cpu().numpy()
        self.terminated[:] = out.get("terminated").reshape(n).cpu().numpy()
        self.truncated[:] = out.get("truncated").reshape(n).cpu().numpy()
        self.any_done = bool(self.terminated.any() or self.truncated.any())
        self._td = out

    def _reset_all(self, seeds: Sequence[int] | None) -> None:
        if seeds is not None:
            self._env.set_seed(seeds[0], static_seed=len(set(seeds)) == 1 and len(seeds) > 1)
        self._td = self._env.reset()
        self._write(self._td)

    def _reset_rows(self, mask: np.ndarray) -> None:
        import torch
        from tensordict import TensorDict

        if not self._batched:
            self._reset_all(None)
            return
        reset_td = TensorDict(
            {"_reset": torch.from_numpy(mask.copy()).unsqueeze(-1)}, batch_size=self._env.batch_size
        )
        fresh = self._env.reset(reset_td)
        m = torch.from_numpy(mask.copy())
        for key in self._obs_keys:
            self._td.get(key)[m] = fresh.get(key)[m]
        self._write(self._td)

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        # torchrl seeds at once and picks its own next seed; keep its answer.
        return int(self._env.set_seed(seed, static_seed=static_seed))

    def _close(self) -> None:
        self._env.close()


def _torch_dtype(name: str) -> Any:
    import torch

    return torch.from_numpy(np.empty(0, dtype=name)).dtype


def _spec_from_torchrl(spec: Any, batch: tuple[int, ...]) -> ArraySpec:
    import torch

    shape = tuple(spec.shape)[len(batch) :]
    dtype = str(torch.empty(0, dtype=spec.dtype).numpy().dtype)
    name = type(spec).__name__
    if name in ("Categorical", "DiscreteTensorSpec"):
        return ArraySpec(shape, dtype, 0.0, float(spec.space.n - 1), int(spec.space.n))
    if name in ("OneHot", "OneHotDiscreteTensorSpec"):
        # TorchRL's default for discrete gym envs: the policy writes one-hot
        # actions and the env gets them as they are, as in TorchRL's collectors.
        return ArraySpec(shape, dtype, 0.0, 1.0, one_hot=True)
    low = high = None
    if hasattr(spec, "space") and hasattr(spec.space, "low"):
        low_t = spec.space.low.reshape(-1, *shape)[0] if batch else spec.space.low
        high_t = spec.space.high.reshape(-1, *shape)[0] if batch else spec.space.high
        low = _scalar_or_tuple(low_t.double().numpy())
        high = _scalar_or_tuple(high_t.double().numpy())
    return ArraySpec(shape, dtype, low, high)


def _scalar_or_tuple(a: np.ndarray) -> float | tuple[float, ...]:
    flat = a.reshape(-1)
    if flat.size and np.all(flat == flat[0]):
        return float(flat[0])
    return tuple(float(x) for x in flat)
