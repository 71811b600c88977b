"""EnvPool stepped through its C++ binding (``_send`` / ``_recv``), its state layout read once.

EnvPool's public ``step`` wraps two C++ calls in Python that, for a cheap env, costs
about as much as the step itself: per call it rebuilds its ``config`` dict (twice),
converts the action into a dict and back, unflattens the flat state list into a
tree with optree and builds an info dict (about 20 of 65 us for 8 Pendulum envs on
one thread). The state list's layout is fixed for the life of the pool, so
`RawEnvPool` finds once which entries are the observations, ``reward``, ``done``,
``trunc`` and ``info:env_id``, and where the action goes in the list ``_send``
takes; then it calls ``_send`` / ``_recv`` itself and copies those entries straight
into the pool's buffers.

That layout is no documented interface. `resolve_raw_layout` checks it against
EnvPool's own converters (``_from`` for actions, ``_to`` for states) on made-up
inputs at creation, and `RawEnvPool` checks the first real reset and step against
``_to`` too. Anything that does not match (another EnvPool version, a multi-player
or dict-action env, the gym or dm_env API, a stand-in) leaves the pool on the public
API, said once in a DEBUG log: a future EnvPool cannot feed wrong columns silently.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from .env_pools import check_observation

__all__ = ["Binding", "RawEnvPool", "RawLayout", "binding", "resolve_raw_layout"]

_log = logging.getLogger(__name__)

#: EnvPool's private binding, in `Binding`'s order.
_BINDING = ("_send", "_recv", "_reset", "_to", "_from", "_state_keys", "_action_keys")
_RECV = "_recv"
_ID_KEYS = ("env_id", "players.env_id")
#: The four (done, trunc) combinations: the made-up state's rows.
_DONE = np.array([True, True, False, False])
_TRUNC = np.array([True, False, True, False])


class RawLayout(NamedTuple):
    """Where things are in EnvPool's flat state list and in the list ``_send`` takes."""

    obs_paths: tuple[tuple[str, ...], ...]  # the pool's observation buffers
    is_dict: bool  # a Dict space: the paths index the observation dict; else one bare array
    obs: tuple[int, ...]  # state index of each observation buffer, in the pool's order
    reward: int
    done: int
    trunc: int
    env_id: int
    num_state: int
    id_slots: tuple[int, ...]  # positions of env_id (and players.env_id) in the action list
    action_slot: int
    action_dtype: np.dtype


class Binding(NamedTuple):
    """EnvPool's private C++ binding and converters, read in one place: `binding`."""

    send: Callable[[list[Any]], None]  # the list of action arrays -> queued
    recv: Callable[[], list[Any]]  # -> the flat state list
    reset: Callable[[np.ndarray], None]  # env ids -> queued
    to: Callable[..., Any]  # (state list, reset, return_info) -> the public result
    from_: Callable[..., list[Any]]  # (action, env_id) -> the list ``send`` takes
    state_keys: list[str]
    action_keys: list[str]


def binding(venv: Any) -> Binding:
    """``venv``'s EnvPool binding (``_send``, ``_recv``, ...): the one place that reads it.

    Looked up statically first (AttributeError if absent), so that a wrapper's
    ``__getattr__`` is never asked.
    """
    for name in _BINDING:
        inspect.getattr_static(venv, name)
    v = venv  # EnvPool's private binding, read here only (tests/test_layout.py counts it)
    return Binding(v._send, v._recv, v._reset, v._to, v._from,  # noqa: SLF001
                   v._state_keys, v._action_keys)  # noqa: SLF001


@contextlib.contextmanager
def watching_recv(venv: Any, recv: Callable[[], list[Any]]) -> Iterator[None]:
    """``venv``'s public API calls ``recv`` instead of its ``_recv`` inside the block (an
    instance attribute shadows the class's method, deleted after)."""
    setattr(venv, _RECV, recv)
    try:
        yield
    finally:
        delattr(venv, _RECV)


class _Mismatch(Exception):
    """The binding does not look as the raw path expects (the message says where)."""


def resolve_raw_layout(venv: Any, obs_paths: Sequence[tuple[str, ...]], is_dict: bool,
                       action_shape: tuple[int, ...]) -> RawLayout | str:
    """The layout of ``venv``'s binding, checked against its own converters; else why not.

    ``obs_paths`` are the pool's observation buffers (``is_dict``: a Dict space, the
    paths index the observation dict; else one bare array), ``action_shape`` one env's
    action shape. Nothing is stepped: ``_from`` and ``_to`` are given made-up inputs.
    """
    try:
        bound = binding(venv)
        config = venv.config
        if int(config.get("max_num_players", 1)) != 1:
            raise _Mismatch(f"max_num_players={config.get('max_num_players')}")
        num_envs = int(config["num_envs"])
        id_slots, action_slot, dtype = _action_layout(bound, num_envs, action_shape)
        return _state_layout(bound, obs_paths, is_dict)._replace(
            id_slots=id_slots, action_slot=action_slot, action_dtype=dtype)
    except AttributeError as exc:
        return f"no {exc}"
    except Exception as exc:  # whatever EnvPool's converters raise on this input: not ours
        return f"{type(exc).__name__}: {exc}"


def _action_layout(bound: Binding, num_envs: int, action_shape: tuple[int, ...]
                   ) -> tuple[tuple[int, ...], int, np.dtype]:
    keys = list(bound.action_keys)
    if "env_id" not in keys or len([k for k in keys if k not in _ID_KEYS]) != 1:
        raise _Mismatch(f"action keys {keys}: expected env_id and one action")
    id_slots = tuple(keys.index(k) for k in _ID_KEYS if k in keys)
    action_slot = next(i for i, k in enumerate(keys) if k not in _ID_KEYS)
    ids = np.arange(num_envs, dtype=np.int32)
    probe = np.arange(num_envs * int(np.prod(action_shape)), dtype=np.float64)
    probe = probe.reshape(num_envs, *action_shape)
    for asked, rows in ((None, ids), (ids[::2].copy(), ids[::2])):
        sent = bound.from_(probe[rows], asked)
        if len(sent) != len(keys):
            raise _Mismatch(f"_from gave {len(sent)} arrays for the action keys {keys}")
        action = np.asarray(sent[action_slot])
        if action.shape != (len(rows), *action_shape) or not np.array_equal(
                action, probe[rows].astype(action.dtype)):
            raise _Mismatch(f"_from's action {action.shape} is not the action given")
        if any(not np.array_equal(sent[i], rows) for i in id_slots):
            raise _Mismatch("_from's env ids are not the ids asked for")
    return id_slots, action_slot, action.dtype


def _state_layout(bound: Binding, obs_paths: Sequence[tuple[str, ...]], is_dict: bool) -> RawLayout:
    keys = list(bound.state_keys)
    if "done" not in keys or "trunc" not in keys:
        raise _Mismatch(f"state keys {keys}: no done / trunc")
    done, trunc = keys.index("done"), keys.index("trunc")
    fake = [np.full(4, i, dtype=np.int64) for i in range(len(keys))]
    fake[done], fake[trunc] = _DONE.copy(), _TRUNC.copy()
    out = bound.to(fake, False, True)
    if not isinstance(out, tuple) or len(out) != 5 or not isinstance(out[4], dict):
        raise _Mismatch(f"_to gave {type(out).__name__}, not gymnasium's 5-tuple")
    obs, reward, terminated, truncated, info = out
    expected = np.greater(_DONE, _TRUNC)  # what RawEnvPool computes: done & ~trunc
    if not (isinstance(terminated, np.ndarray) and terminated.dtype == bool
            and np.array_equal(terminated, expected)):
        raise _Mismatch(f"terminated is not done & ~trunc: {terminated!r}")
    if truncated is not fake[trunc]:
        raise _Mismatch("truncated is not the trunc entry")
    where = _finder(fake)
    obs_index = tuple(where(_obs_leaf(obs, p, is_dict), ".".join(p)) for p in obs_paths)
    layout = RawLayout(tuple(obs_paths), is_dict, obs_index, where(reward, "reward"), done, trunc,
                       where(info.get("env_id"), "info env_id"), len(keys), (), 0,
                       np.dtype(np.float32))
    reset = bound.to(fake, True, True)
    if not isinstance(reset, tuple) or len(reset) != 2 or not isinstance(reset[1], dict):
        raise _Mismatch("_to's reset is not (obs, info)")
    if any(where(_obs_leaf(reset[0], p, is_dict), "reset obs") != i
           for p, i in zip(obs_paths, obs_index, strict=True)) \
            or where(reset[1].get("env_id"), "reset env_id") != layout.env_id:
        raise _Mismatch("a reset's entries are not a step's")
    return layout


def _finder(fake: list[np.ndarray]) -> Any:
    def where(value: object, what: str) -> int:
        for i, entry in enumerate(fake):
            if value is entry:
                return i
        raise _Mismatch(f"{what} is no entry of the state list")
    return where


def _obs_leaf(obs: Any, path: tuple[str, ...], is_dict: bool) -> Any:
    if not is_dict:
        return obs
    for p in path:
        obs = obs[p]
    return obs


class RawEnvPool:
    """``_send`` / ``_recv`` on ``venv`` with ``layout``, results into the pool's buffers.

    ``obs`` are the pool's observation buffers (``[N, ...]``, in the layout's order),
    ``reward`` / ``terminated`` / ``truncated`` its ``[N]`` buffers. The first reset and
    the first step go through EnvPool's public API, the state list its ``_recv`` gave
    captured on the way: they return EnvPool's own result for the caller to write,
    and `ok` says whether that result was read from the state list where the layout
    says (the same arrays). When it was not, the caller stays on the public API.
    """

    def __init__(self, venv: Any, layout: RawLayout, obs: Sequence[np.ndarray],
                 reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
                 action_shape: tuple[int, ...]) -> None:
        self.layout = layout
        self._venv = venv
        bound = binding(venv)
        self._send, self._recv, self._reset = bound.send, bound.recv, bound.reset
        n = len(reward)
        self._obs = list(zip(obs, layout.obs, layout.obs_paths, strict=True))
        self._reward, self._terminated, self._truncated = reward, terminated, truncated
        self._ids = np.arange(n, dtype=np.int32)
        self._in_order = self._ids.tobytes()
        self._act_shape = (n, *action_shape)
        self._act_buf: np.ndarray | None = None
        #: The list ``_send`` gets for a step of every env; its action slot is set per step.
        self._send_all: list[Any] = [None] * (len(layout.id_slots) + 1)
        for i in layout.id_slots:
            self._send_all[i] = self._ids
        #: What has not been checked against the public API yet ("reset", "step").
        self._unchecked = {"reset", "step"}
        #: False once a checked call did not read as the layout says: use the public API.
        self.ok = True

    def step(self, actions: np.ndarray) -> tuple[Any, ...] | None:
        """Step every env; None when written, else EnvPool's public result to write."""
        if self._unchecked:
            return self._checked("step", lambda: self._venv.step(actions))
        lay, send = self.layout, self._send_all
        send[lay.action_slot] = self._as_sent(actions)
        self._send(send)
        state = self._recv()
        ids = state[lay.env_id]
        rows = Ellipsis if ids.tobytes() == self._in_order else np.asarray(ids)
        self._write_obs(state, rows)
        done, trunc = state[lay.done], state[lay.trunc]
        self._reward[rows] = state[lay.reward]
        self._truncated[rows] = trunc
        if rows is Ellipsis:
            np.greater(done, trunc, out=self._terminated)  # done & ~trunc, no temporary
        else:
            self._terminated[rows] = np.greater(done, trunc)
        return None

    def step_ids(self, actions: np.ndarray, ids: np.ndarray) -> None:
        """Step the envs ``ids`` only (their NEXT_STEP reset step): observations written."""
        lay = self.layout
        sent: list[Any] = [ids] * (len(lay.id_slots) + 1)
        sent[lay.action_slot] = np.ascontiguousarray(actions, dtype=lay.action_dtype)
        self._send(sent)
        state = self._recv()
        self._write_obs(state, np.asarray(state[lay.env_id]))

    def reset(self, ids: np.ndarray | None = None) -> tuple[Any, ...] | None:
        """Reset every env or ``ids``; None when written, else EnvPool's ``(obs, info)``."""
        if self._unchecked:
            return self._checked("reset", lambda: self._venv.reset(
                None if ids is None else ids))
        self._reset(self._ids if ids is None else ids)
        state = self._recv()
        self._write_obs(state, np.asarray(state[self.layout.env_id]))
        return None

    def _as_sent(self, actions: np.ndarray) -> np.ndarray:
        """The actions as ``_send`` takes them: C order, EnvPool's dtype (cast as its
        ``astype`` casts), the given array itself when it already is so (no copy)."""
        lay = self.layout
        if actions.__class__ is np.ndarray and actions.dtype is lay.action_dtype \
                and actions.flags.c_contiguous and actions.shape == self._act_shape:
            return actions
        if actions.shape != self._act_shape:
            raise ValueError(f"EnvPool expects actions of shape {self._act_shape}, got "
                             f"{actions.shape}")
        if self._act_buf is None:
            self._act_buf = np.empty(self._act_shape, dtype=lay.action_dtype)
        np.copyto(self._act_buf, actions, casting="unsafe")
        return self._act_buf

    def _write_obs(self, state: list[Any], rows: Any) -> None:
        for arr, i, path in self._obs:
            value = state[i]
            if value.__class__ is not np.ndarray or value.dtype is not arr.dtype \
                    or value.shape[1:] != arr.shape[1:]:
                check_observation("every env", path, value, arr)
            arr[rows] = value

    def _checked(self, kind: str, public_call: Any) -> tuple[Any, ...]:
        """``public_call()`` (EnvPool's own step or reset) with the state list its ``_recv``
        gave captured: the result must hold those very arrays where the layout says."""
        venv, captured = self._venv, []

        def capture() -> Any:
            state = self._recv()
            captured.append(state)
            return state

        if not isinstance(getattr(venv, "__dict__", None), dict):
            self._failed(kind, "its _recv cannot be watched (no instance dict)")
            return public_call()  # type: ignore[no-any-return]
        with watching_recv(venv, capture):
            result = public_call()
        self._unchecked.discard(kind)
        why = self._differs(kind, result, captured)
        if why:
            self._failed(kind, why)
        return result  # type: ignore[no-any-return]

    def _differs(self, kind: str, result: Any, captured: list[Any]) -> str:
        """What in EnvPool's ``result`` is not read where the layout says ('' if nothing)."""
        lay = self.layout
        if len(captured) != 1 or len(captured[0]) != lay.num_state:
            return f"_recv gave {[len(c) for c in captured]} entries, {lay.num_state} expected"
        state = captured[0]
        if not isinstance(result, tuple) or len(result) != (2 if kind == "reset" else 5) \
                or not isinstance(result[-1], dict):
            return f"its {kind} gave {type(result).__name__}"
        obs, info = result[0], result[-1]
        if any(_obs_leaf(obs, p, lay.is_dict) is not state[i]
               for p, i in zip(lay.obs_paths, lay.obs, strict=True)):
            return "the observations are not the obs entries"
        if info.get("env_id") is not state[lay.env_id]:
            return "info['env_id'] is not the env_id entry"
        if kind == "step" and not (
                result[1] is state[lay.reward] and result[3] is state[lay.trunc]
                and np.array_equal(result[2], np.greater(state[lay.done], state[lay.trunc]))):
            return "reward, terminated or truncated is not read from its entry"
        return ""

    def _failed(self, kind: str, why: str) -> None:
        self.ok = False
        _log.debug("EnvPool's first %s did not read as the raw layout says (%s): its public "
                   "API from now on", kind, why)
