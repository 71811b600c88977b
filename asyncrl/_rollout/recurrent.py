"""Recurrent policies: which state keys a policy carries, and carrying them step to step.

TorchRL's convention (``LSTMModule``, ``GRUModule`` and any module following
it): a policy reads its state at ``key`` and writes the next one at
``("next", key)``, and reads ``"is_init"`` (True on the first frame after a
reset) to start from zeros. In TorchRL the env carries the state (a
``TensorDictPrimer`` and ``InitTracker`` plus ``step_mdp``); in asyncrl the
rollout does: `find_state_keys` reads the keys off the policy,
`describe_states` adds their shapes and dtypes, and `RecurrentCarry` keeps one
preallocated state per env, records it into the batch in TorchRL's layout
(``key`` and ``("next", key)`` at every frame, ``"is_init"`` and
``("next", "is_init")``) and zeroes it where an env resets.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn

__all__ = [
    "IS_INIT",
    "RecurrentCarry",
    "RecurrentSpec",
    "StateSpec",
    "describe_states",
    "find_state_keys",
]

Path = tuple[str, ...]

#: TorchRL's key (``InitTracker``): True on the first frame of an episode.
IS_INIT: Path = ("is_init",)


def _path(key: Any) -> Path | None:
    if isinstance(key, str):
        return (key,)
    if isinstance(key, tuple) and key and all(isinstance(k, str) for k in key):
        return key
    return None


def _td_key(path: Path) -> str | Path:
    return path[0] if len(path) == 1 else path


@dataclass(frozen=True)
class StateSpec:
    """One recurrent state entry of one env: read at ``key``, written at ``("next", *key)``."""

    key: Path
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class RecurrentSpec:
    """The states a policy carries, in discovery order.

    >>> from torchrl.modules import LSTMModule
    >>> lstm = LSTMModule(input_size=3, hidden_size=8, in_key="observation", out_key="embed")
    >>> spec = describe_states(lstm, find_state_keys(lstm))
    >>> [(s.key, s.shape) for s in spec.states]
    [(('recurrent_state_h',), (1, 8)), (('recurrent_state_c',), (1, 8))]
    """

    states: tuple[StateSpec, ...]

    @property
    def paths(self) -> frozenset[Path]:
        """Every batch key the carry owns (state, next state, ``is_init`` and its next)."""
        keys = {s.key for s in self.states} | {("next", *s.key) for s in self.states}
        return frozenset(keys | {IS_INIT, ("next", *IS_INIT)})


def _declaring_modules(policy: Any) -> Iterator[Any]:
    """The policy, then its submodules: whatever declares ``in_keys``/``out_keys``."""
    yield policy
    if isinstance(policy, nn.Module):
        yield from (m for m in policy.modules() if m is not policy)


def find_state_keys(policy: Any) -> tuple[Path, ...]:
    """Keys ``K`` that a module reads (``K`` in ``in_keys``) and writes as ``("next", *K)``.

    Looks at the policy and, for an ``nn.Module``, every submodule (a
    ``TensorDictSequential(LSTMModule, head)`` or a wrapper around one). Empty
    for a policy without recurrent state: the rollout is then unchanged.

    >>> from tensordict.nn import TensorDictModule
    >>> find_state_keys(TensorDictModule(nn.Linear(2, 1), ["observation"], ["action"]))
    ()
    """
    if isinstance(policy, nn.Module) and not isinstance(policy, TensorDictModuleBase):
        return ()  # called on observation tensors, not on a TensorDict: no keys to carry
    found: dict[Path, None] = {}
    for module in _declaring_modules(policy):
        in_keys, out_keys = getattr(module, "in_keys", None), getattr(module, "out_keys", None)
        if not isinstance(in_keys, list | tuple) or not isinstance(out_keys, list | tuple):
            continue
        outs = {p for p in map(_path, out_keys) if p is not None}
        for path in map(_path, in_keys):
            if path is not None and path[0] != "next" and ("next", *path) in outs:
                found.setdefault(path)
    return tuple(found)


def describe_states(policy: Any, keys: tuple[Path, ...]) -> RecurrentSpec:
    """Shapes and dtypes from the policy's ``make_tensordict_primer()`` where it has one.

    A state no primer describes gets the placeholder ``shape=(-1,)`` here and
    is sized from the policy's first output by `RecurrentCarry.bind`.
    """
    known: dict[Path, tuple[tuple[int, ...], torch.dtype]] = {}
    for module in _declaring_modules(policy):
        make = getattr(module, "make_tensordict_primer", None)
        if not callable(make):
            continue
        try:
            primers = make().primers
        except Exception:  # a primer we cannot build: size the state from the output
            continue
        for key in primers.keys(True, True):
            path = _path(key)
            if path in keys:
                spec = primers[key]
                known[path] = (tuple(spec.shape), spec.dtype)
    return RecurrentSpec(
        tuple(StateSpec(k, *known.get(k, ((-1,), torch.float32))) for k in keys)
    )


_NUMPY_DTYPES = frozenset(
    {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
     torch.float16, torch.float32, torch.float64}
)


class RecurrentCarry:
    """Per-env recurrent state for one rollout: preallocated, copied in place.

    Life cycle: `install` puts the state (zeros) and ``is_init`` (True) into
    the step TensorDict before the rollout's first (dry) policy call; `bind`
    checks what that call wrote at ``("next", key)`` and sizes states no
    primer described; `allocate` adds the batch buffers. Then per step,
    `take` (after a policy call) or `keep` (after a random action) records
    frame ``t`` and carries ``("next", key)`` into ``key``; `reset` zeroes the
    envs that reset and marks them ``is_init``.
    """

    def __init__(self, spec: RecurrentSpec, num_envs: int) -> None:
        self.spec = spec
        self.num_envs = num_envs
        self.is_init = torch.ones((num_envs, 1), dtype=torch.bool)
        self._is_init_np = self.is_init.numpy()
        self.states: list[torch.Tensor | None] = [
            None if s.shape == (-1,) else torch.zeros((num_envs, *s.shape), dtype=s.dtype)
            for s in spec.states
        ]
        # Filled by `allocate`: (is_init, its buffer) and, per state,
        # (state, buffer at key, buffer at ("next", key), next key, state tensor).
        self._init_row: tuple[Any, Any] | None = None
        self._rows: list[tuple[Any, Any, Any, Path, torch.Tensor]] = []
        self._states: list[torch.Tensor] = []

    @property
    def paths(self) -> frozenset[Path]:
        return self.spec.paths

    def install(self, td: TensorDictBase) -> None:
        td.set(_td_key(IS_INIT), self.is_init)
        for s, state in zip(self.spec.states, self.states, strict=True):
            if state is not None:
                td.set(_td_key(s.key), state)

    def bind(self, td: TensorDictBase) -> None:
        """After the dry call: check the next states; put our tensors back in ``td``."""
        specs = []
        for i, s in enumerate(self.spec.states):
            nxt = td.get(("next", *s.key), None)
            want = None if self.states[i] is None else (self.num_envs, *s.shape)
            if not isinstance(nxt, torch.Tensor) or nxt.shape[:1] != (self.num_envs,) or (
                want is not None and tuple(nxt.shape) != want
            ):
                got = tuple(getattr(nxt, "shape", ())) if nxt is not None else None
                raise ValueError(
                    f"the policy reads the recurrent state {_td_key(s.key)!r} but wrote "
                    f"{('next', *s.key)!r} as {type(nxt).__name__} of shape {got}: expected a "
                    f"tensor of shape {want or (self.num_envs, '...')} (num_envs, *state shape)"
                )
            if self.states[i] is None:
                s = StateSpec(s.key, tuple(nxt.shape[1:]), nxt.dtype)
                self.states[i] = torch.zeros((self.num_envs, *s.shape), dtype=s.dtype)
            specs.append(s)
        self.spec = RecurrentSpec(tuple(specs))
        self.install(td)  # the policy may have replaced our entries (LSTMModule does)

    def explain_missing(self, exc: KeyError) -> None:
        """The dry call failed on a missing key: name the states we could not size."""
        unsized = [_td_key(s.key) for s, t in zip(self.spec.states, self.states, strict=True)
                   if t is None]
        if unsized:
            raise ValueError(
                f"the recurrent policy needs the state {unsized} on its first call, and "
                "nothing says its shape: give the module that reads it a "
                "make_tensordict_primer() (as TorchRL's LSTMModule has), or read the state "
                "with a default (td.get(key, None)) and start from zeros"
            ) from exc

    def allocate(self, data: dict[Any, torch.Tensor], steps: int) -> None:
        """Add ``key``, ``("next", key)``, ``is_init``, ``("next", "is_init")`` buffers."""
        n = self.num_envs
        data[IS_INIT] = torch.zeros((n, steps, 1), dtype=torch.bool)
        # TorchRL's ("next", "is_init") is False on every frame (InitTracker's step).
        data[("next", *IS_INIT)] = torch.zeros((n, steps, 1), dtype=torch.bool)
        self._init_row = (self._is_init_np, data[IS_INIT].numpy())
        rows: list[tuple[Any, Any, Any, Path, torch.Tensor]] = []
        for s, state in zip(self.spec.states, self.states, strict=True):
            assert state is not None
            now = data[s.key] = torch.zeros((n, steps, *s.shape), dtype=s.dtype)
            nxt = data[("next", *s.key)] = torch.zeros((n, steps, *s.shape), dtype=s.dtype)
            next_key = ("next", *s.key)
            if s.dtype in _NUMPY_DTYPES:  # numpy writes are ~2x cheaper than torch indexing
                rows.append((state.numpy(), now.numpy(), nxt.numpy(), next_key, state))
            else:
                rows.append((state, now, nxt, next_key, state))
        self._rows = rows
        self._states = [state for state in self.states if state is not None]

    def take(self, i: tuple[slice, int], td: TensorDictBase) -> None:
        """Record frame ``i`` after a policy call; carry the policy's next state."""
        flag, dst = self._init_row  # type: ignore[misc]
        dst[i] = flag
        flag.fill(False)
        for src, now, nxt, key, state in self._rows:
            now[i] = src
            state.copy_(td.get(key))  # in place: the policy sees it through its entry
            nxt[i] = src

    def keep(self, i: tuple[slice, int]) -> None:
        """Record frame ``i`` after a random action: the state stays as it is."""
        flag, dst = self._init_row  # type: ignore[misc]
        dst[i] = flag
        flag.fill(False)
        for src, now, nxt, _key, _state in self._rows:
            now[i] = src
            nxt[i] = src

    def reset(self, mask: np.ndarray | None = None) -> None:
        """Zero the state and set ``is_init`` of the envs in ``mask`` (all when None)."""
        if mask is None:
            self.is_init.fill_(True)
            for state in self._states or self.states:
                if state is not None:
                    state.zero_()
            return
        m = torch.from_numpy(np.ascontiguousarray(mask, dtype=bool))
        self.is_init[m] = True
        for state in self._states or self.states:
            if state is not None:
                state[m] = 0
