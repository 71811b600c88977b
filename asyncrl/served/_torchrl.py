"""A served module as a TorchRL transform: ``TransformedEnv(env, ServedModuleTransform(handle))``.

TorchRL's ``RayModuleTransform`` calls a module that lives once in a Ray actor from
every env's transform chain. :class:`ServedModuleTransform` is that for an
:class:`~asyncrl.served.ServedModule`: at each step it gives the module the keys it
names (``"observation"`` and ``"action"`` from the step's input, ``"next_observation"``
and ``"reward"`` from its output, or any mapping given), writes the module's output
at ``out_key`` (the reward, by default) of the step's output, and the weights'
version at ``("served_versions", name)`` beside it (declared in the observation spec,
so a collector keeps it per frame). Importable only with torchrl installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

try:
    from torchrl.data import Composite, Unbounded
    from torchrl.envs.transforms import Transform
except ImportError as exc:  # pragma: no cover - the optional extra is missing
    raise ImportError("ServedModuleTransform needs torchrl (pip install 'asyncrl[torchrl]'); "
                      "gymnasium envs use asyncrl.ServedReward / ServedObservation") from exc

from ._client import ServedModuleClient
from ._errors import ServedModuleError
from ._handle import ServedModuleHandle
from ._remote_client import RemoteServedClient, connect

__all__ = ["ServedModuleTransform"]

NestedKey = str | tuple[str, ...]

#: Where an input named so is read by default: (from the step's output?, key).
_DEFAULT_KEYS: dict[str, tuple[bool, NestedKey]] = {
    "observation": (False, "observation"), "action": (False, "action"),
    "next_observation": (True, "observation"), "reward": (True, "reward")}


class ServedModuleTransform(Transform):  # type: ignore[misc]
    """Calls a served module at each step; its output goes to ``out_key`` (the reward).

    ``in_keys``: ``{input name: key}``; a key starting with ``"next"`` is read from the
    step's output (``("next", "observation")``), any other from its input. Without it,
    inputs named ``observation``, ``action``, ``next_observation``, ``reward`` are read
    where those names say. A batched env calls once per env (one client slot in all).

    >>> env = TransformedEnv(GymEnv("CartPole-v1"),                   # doctest: +SKIP
    ...                      ServedModuleTransform(served.handle))
    >>> env.rollout(3)["next", "served_versions", "env.transform[0]"]  # doctest: +SKIP
    """

    def __init__(self, handle: ServedModuleHandle, *,
                 in_keys: Mapping[str, NestedKey] | None = None,
                 out_key: NestedKey = "reward") -> None:
        sources: list[tuple[bool, NestedKey]] = []
        for name in handle.input_names:
            if in_keys is not None and name in in_keys:
                key = in_keys[name]
                path = (key,) if isinstance(key, str) else tuple(key)
                nested = path[0] == "next" and len(path) > 1
                rest = path[1:] if nested else path
                sources.append((nested, rest[0] if len(rest) == 1 else rest))
            elif name in _DEFAULT_KEYS:
                sources.append(_DEFAULT_KEYS[name])
            else:
                raise ServedModuleError(
                    f"served module {handle.name!r} takes input {name!r}: say which key it "
                    f"is, e.g. ServedModuleTransform(handle, in_keys={{{name!r}: "
                    "('next', 'observation')}})")
        super().__init__(in_keys=[k for _, k in sources], out_keys=[out_key])
        self.handle = handle
        self._sources = sources
        self.version_key = ("served_versions", handle.name)
        self._client: ServedModuleClient | RemoteServedClient | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None  # a slot is this process's: the next one claims its own
        return state

    @property
    def client(self) -> ServedModuleClient | RemoteServedClient:
        if self._client is None:
            self._client = connect(self.handle)
        return self._client

    def _step(self, tensordict: TensorDictBase,
              next_tensordict: TensorDictBase) -> TensorDictBase:
        inputs = [(next_tensordict if nested else tensordict).get(key)
                  for nested, key in self._sources]
        batch = next_tensordict.batch_size
        out_key = self.out_keys[0]
        like = next_tensordict.get(out_key, None)
        rows = int(np.prod(batch)) if len(batch) else 1
        flat = [x.reshape(rows, *x.shape[len(batch):]) for x in inputs]
        outputs, versions = [], []
        for row in range(rows):
            out, version = self.client([x[row].detach().cpu().numpy() for x in flat])
            outputs.append(torch.from_numpy(out))
            versions.append(version)
        value = torch.stack(outputs).reshape(*batch, *outputs[0].shape)
        if like is not None:
            value = value.reshape(like.shape).to(like.dtype)
        next_tensordict.set(out_key, value)
        next_tensordict.set(self.version_key,
                            torch.tensor(versions, dtype=torch.int64).reshape(batch))
        return next_tensordict

    def _reset(self, tensordict: TensorDictBase,
               tensordict_reset: TensorDictBase) -> TensorDictBase:
        return tensordict_reset

    def transform_observation_spec(self, observation_spec: Any) -> Any:
        shape = observation_spec.shape
        versions = observation_spec.get("served_versions", None)
        if versions is None:
            versions = Composite(shape=shape)
            observation_spec["served_versions"] = versions
        versions[self.handle.name] = Unbounded(shape=shape, dtype=torch.int64)
        return observation_spec

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
