"""TensorDict keys as users give them (``policy_in_keys``, ``info_keys``...), checked once.

Plain Python (no torch): an env worker of central inference reads its envs' infos
with these keys and imports no torch (:mod:`asyncrl._spawn.torch_free`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

__all__ = ["NestedKey", "normalise_keys"]

NestedKey: TypeAlias = str | tuple[str, ...]


def normalise_keys(name: str, keys: Any) -> tuple[NestedKey, ...] | None:
    """``keys`` as a tuple of TensorDict keys (a str or a tuple of str each), or None."""
    if keys is None:
        return None
    if isinstance(keys, str):
        keys = (keys,)
    if not isinstance(keys, Sequence) or not keys:
        raise TypeError(f"{name} must be a non-empty list of keys (str, or tuples of str for "
                        f"nested keys), got {keys!r}")
    out: list[NestedKey] = []
    for key in keys:
        if isinstance(key, list):
            key = tuple(key)
        if not (isinstance(key, str) and key) and not (
                isinstance(key, tuple) and key and all(isinstance(k, str) and k for k in key)):
            raise TypeError(f"{name}: {key!r} is not a key: give a str, or a tuple of str for "
                            "a nested key")
        out.append(key[0] if isinstance(key, tuple) and len(key) == 1 else key)
    if len(set(out)) != len(out):
        raise ValueError(f"{name} names a key twice: {list(out)}")
    if name == "policy_out_keys" and "action" not in out:
        raise ValueError(f"policy_out_keys={list(out)} has no 'action': the rollout steps the "
                         "env with the output written to 'action'; name that output 'action'")
    return tuple(out)
