"""The rollout options of TorchRL's collectors, as one object checked once.

``max_frames_per_traj``, ``reset_at_each_iter``, ``reset_when_done``,
``set_truncated``, ``exploration_type`` and the devices (``policy_device``,
``env_device``, ``storing_device``, resolved by
:class:`~asyncrl._rollout.devices.DeviceLayout`) are collector arguments (TorchRL's
names) that only the rollout reads; so are ``policy_in_keys``, ``policy_out_keys``
and ``policy_method``, how to call a plain torch module, and ``info_keys``. A collector builds one
:class:`RolloutOptions` from them in its constructor, so a wrong value fails
there, in the trainer, rather than in every worker; the object then travels as
it is: ``WorkerSpec.rollout`` -> the worker -> ``Rollout(options=...)``.

A remote host gets the trainer's options as data in its welcome
(:meth:`RolloutOptions.to_wire` / :meth:`RolloutOptions.from_wire`): every field
travels except the devices (:data:`HOST_FIELDS`), so a new option travels without
any layer naming it. The decoding treats the map as hostile input: each field's
type and bounds are checked (:data:`_DECODERS`, one entry per travelling field)
before the options are built, and anything else is a ``ProtocolError``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from transports import ProtocolError

from .devices import DeviceLayout, check_device
from .infos import normalise_info_keys
from .plain_policies import NestedKey, normalise_keys, normalise_method
from .policies import ExplorationType, resolve_exploration_type

__all__ = ["HOST_FIELDS", "RolloutOptions", "wire_fields"]

#: The fields decided where a worker runs, which never travel in a welcome:
#: ``policy_device`` is the host's own (``asyncrl worker --device``: which GPU a host
#: uses is its business, and the trainer's device names may not exist there),
#: ``env_device`` goes with it (a host's envs step on its CPU; only the policy's input
#: may live on its device), and ``storing_device`` is the trainer's (a worker's batch
#: leaves it as host bytes; the trainer moves it there on receipt).
HOST_FIELDS = frozenset({"policy_device", "env_device", "storing_device"})


@dataclass(frozen=True)
class RolloutOptions:
    """How a rollout steps its envs and stores its frames (TorchRL's meanings).

    Values are normalised once, here, so every reader sees one spelling:
    ``max_frames_per_traj`` <= 0 (TorchRL's -1) becomes None (no limit),
    ``exploration_type`` an ``ExplorationType`` (or None: leave the caller's
    context as it is), each device a ``torch.device`` this machine has, or None.

    >>> options = RolloutOptions(max_frames_per_traj=-1, exploration_type="mode",
    ...                          storing_device="cpu")
    >>> options.max_frames_per_traj, options.exploration_type.name, options.storing_device
    (None, 'MODE', device(type='cpu'))
    >>> RolloutOptions(reset_when_done=False)
    Traceback (most recent call last):
    ...
    ValueError: reset_when_done=False is not supported: ...
    """

    max_frames_per_traj: int | None = None
    reset_at_each_iter: bool = False
    reset_when_done: bool = True
    set_truncated: bool = False
    #: Also given as a name (``"random"``, ``"MODE"``): resolved to the member.
    exploration_type: ExplorationType | None = ExplorationType.RANDOM
    #: Also given as a device name (``"cpu"``, ``"cuda:0"``): made a ``torch.device``.
    storing_device: torch.device | None = None
    #: Where the policy runs: observations are moved there, actions back (None: the host).
    policy_device: torch.device | None = None
    #: Where env outputs live: the host, or the policy's device (see ``DeviceLayout``).
    env_device: torch.device | None = None
    #: How to call a plain module (see `asyncrl._rollout.plain_policies`): the observation
    #: keys it takes, the keys its outputs go to, the method called instead of forward.
    policy_in_keys: Sequence[NestedKey] | None = None  # normalised to a tuple
    policy_out_keys: Sequence[NestedKey] | None = None  # normalised to a tuple
    policy_method: str | None = None
    #: Info entries that go into the batch under ``"next"`` (see `asyncrl._rollout.infos`):
    #: keys, or ``{key: spec}``; normalised to ``((path, spec or None), ...)``.
    info_keys: Any = None

    def __post_init__(self) -> None:
        if not self.reset_when_done:
            raise ValueError(
                "reset_when_done=False is not supported: gymnasium envs must be reset once "
                "an episode ends, so the rollout always resets finished envs"
            )
        # Frozen: the normalised values are written past the dataclass's guard.
        set_ = object.__setattr__
        set_(self, "max_frames_per_traj", _frames_limit(self.max_frames_per_traj))
        set_(self, "exploration_type", resolve_exploration_type(self.exploration_type))
        for name in ("policy_in_keys", "policy_out_keys"):
            set_(self, name, normalise_keys(name, getattr(self, name)))
        set_(self, "policy_method", normalise_method(self.policy_method))
        set_(self, "info_keys", normalise_info_keys(self.info_keys))
        for name in ("storing_device", "policy_device", "env_device"):
            set_(self, name, check_device(name, getattr(self, name)))

    @property
    def devices(self) -> DeviceLayout:
        """The three devices as one :class:`~asyncrl._rollout.devices.DeviceLayout`."""
        return DeviceLayout(self.policy_device, self.env_device, self.storing_device)

    def to_wire(self) -> dict[str, Any]:
        """Every travelling option (all but :data:`HOST_FIELDS`) as msgpack data.

        >>> RolloutOptions(max_frames_per_traj=5, exploration_type="mode",
        ...                policy_in_keys=[("a", "b")]).to_wire()["policy_in_keys"]
        [['a', 'b']]
        >>> wire = RolloutOptions(info_keys={"pos": ((2,), "float32")}).to_wire()
        >>> RolloutOptions.from_wire(wire) == RolloutOptions(info_keys={"pos": ((2,), "float32")})
        True
        """
        return {name: _plain(getattr(self, name)) for name in wire_fields()}

    @classmethod
    def from_wire(cls, wire: Any, *, base: RolloutOptions | None = None) -> RolloutOptions:
        """The options a welcome's ``rollout`` map says, over ``base``'s.

        ``base`` (this host's own options; default: the defaults) keeps its devices
        and every option the map leaves out (a trainer before rollout options sends
        none). A map that is not a map of known options with values of their type
        and bounds raises ``ProtocolError`` naming the option, what it must be and
        what came: it came from the network.
        """
        if not isinstance(wire, Mapping) or len(wire) > MAX_WIRE_OPTIONS:
            raise ProtocolError(f"welcome rollout must be a map of at most {MAX_WIRE_OPTIONS} "
                                f"rollout options, got {_shown(wire)}")
        unknown = sorted(map(_shown, set(wire) - set(wire_fields())))
        if unknown:
            raise ProtocolError(
                f"welcome rollout names options this host does not know: {', '.join(unknown)} "
                f"(it knows {', '.join(wire_fields())}); the trainer sends only the options a "
                "host's hello names: is it asyncrl? upgrade the older of the two")
        decoded = {name: _DECODERS[name](name, value) for name, value in wire.items()}
        try:
            return replace(base or cls(), **decoded)
        except (TypeError, ValueError) as exc:  # the normalisers' own checks
            raise ProtocolError(f"welcome rollout: {exc}") from None


def wire_fields() -> tuple[str, ...]:
    """The names of the options a welcome carries, in declaration order."""
    return tuple(f.name for f in fields(RolloutOptions) if f.name not in HOST_FIELDS)


def _frames_limit(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"max_frames_per_traj must be an int (-1 or None: no limit), got "
                        f"{type(value).__name__} {value!r}")
    limit = int(value)
    return limit if limit > 0 else None  # TorchRL spells "no limit" -1


# -- the wire form ------------------------------------------------------------------------
#: Bounds on what a welcome's rollout map may hold: far above any real run, far below
#: what would cost a worker memory or time to take apart.
MAX_WIRE_OPTIONS = 64
MAX_WIRE_KEYS = 64  # policy keys, info entries
MAX_WIRE_DEPTH = 8  # parts of one nested key
MAX_WIRE_TEXT = 256  # one key part, a method name, an exploration type, a dtype
MAX_INFO_ELEMENTS = 1 << 20  # values of one info entry per env (its buffer is allocated)


def _plain(value: Any) -> Any:
    """A normalised option value as msgpack data: tuples as lists, an enum by name."""
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, ExplorationType):
        return value.name
    return value


def _shown(value: Any) -> str:
    """A peer's value in an error message: its repr (control characters escaped), cut."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _refuse(name: str, expected: str, value: Any) -> ProtocolError:
    return ProtocolError(f"welcome rollout option {name} must be {expected}, got {_shown(value)}")


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _refuse(name, "true or false", value)
    return value


def _frames(name: str, value: Any) -> int | None:
    if value is not None and (type(value) is not int or not 0 < value < 1 << 62):
        raise _refuse(name, "null (no limit) or an int in 1..2**62", value)
    return value


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_WIRE_TEXT:
        raise _refuse(name, f"a string of 1 to {MAX_WIRE_TEXT} characters", value)
    return value


def _optional_text(name: str, value: Any) -> str | None:
    return None if value is None else _text(name, value)


def _path(name: str, value: Any) -> tuple[str, ...]:
    """A nested key: a list of 1 to MAX_WIRE_DEPTH strings."""
    if not isinstance(value, list) or not 0 < len(value) <= MAX_WIRE_DEPTH:
        raise _refuse(name, f"keys: a string or a list of 1 to {MAX_WIRE_DEPTH} strings", value)
    return tuple(_text(name, part) for part in value)


def _list(name: str, value: Any, what: str) -> list[Any]:
    if not isinstance(value, list) or not 0 < len(value) <= MAX_WIRE_KEYS:
        raise _refuse(name, f"null or a list of 1 to {MAX_WIRE_KEYS} {what}", value)
    return value


def _keys(name: str, value: Any) -> tuple[str | tuple[str, ...], ...] | None:
    if value is None:
        return None
    return tuple(_text(name, key) if isinstance(key, str) else _path(name, key)
                 for key in _list(name, value, "keys"))


def _info_keys(name: str, value: Any) -> dict[tuple[str, ...], Any] | None:
    """``[[path, spec or null], ...]`` as the ``{path: spec}`` map ``info_keys`` takes."""
    if value is None:
        return None
    out: dict[tuple[str, ...], Any] = {}
    for entry in _list(name, value, "[key path, spec or null] pairs"):
        if not isinstance(entry, list) or len(entry) != 2:
            raise _refuse(name, "[key path, spec or null] pairs", entry)
        path, spec = _path(name, entry[0]), entry[1]
        if spec is not None:
            spec = _info_spec(name, spec)
        out[path] = spec
    return out


def _info_spec(name: str, spec: Any) -> tuple[tuple[int, ...], str]:
    """``[shape, dtype name]``, whose buffer a worker allocates: its size is bounded."""
    expected = (f"specs as [shape (at most {MAX_WIRE_DEPTH} sizes), dtype name] of at most "
                f"{MAX_INFO_ELEMENTS} values")
    if not (isinstance(spec, list) and len(spec) == 2 and isinstance(spec[0], list)
            and len(spec[0]) <= MAX_WIRE_DEPTH
            and all(type(d) is int and 0 <= d <= MAX_INFO_ELEMENTS for d in spec[0])
            and math.prod(spec[0]) <= MAX_INFO_ELEMENTS):
        raise _refuse(name, expected, spec)
    return tuple(spec[0]), _text(name, spec[1])


#: How each travelling option is read from a welcome: its type and bounds (then the
#: class's own normalisers check its meaning). A test holds it to :func:`wire_fields`.
_DECODERS: dict[str, Callable[[str, Any], Any]] = {
    "max_frames_per_traj": _frames,
    "reset_at_each_iter": _bool,
    "reset_when_done": _bool,
    "set_truncated": _bool,
    "exploration_type": _optional_text,
    "policy_in_keys": _keys,
    "policy_out_keys": _keys,
    "policy_method": _optional_text,
    "info_keys": _info_keys,
}
