"""Central inference's messages: an env worker's layout, welcome, observations, actions, chunks.

An env worker of :class:`~asyncrl.AsyncBatchedCollector` joins as any worker does: the
one :class:`~asyncrl._protocol.admission.Hello` with ``role="env"``, its ``specs`` the
layout of its envs (:class:`EnvLayout`), judged by the one admission
(:class:`asyncrl._coordinator.admission.Admission`) and refused with the one
:class:`~asyncrl._protocol.admission.Refuse`. What follows is central inference's own:

* :class:`EnvWelcome` (collector -> env worker): its slot in the inference loop, its
  traj tag, the chunk length and the layout of the policy's answers;
* :class:`Observations` (``obs``, env worker -> collector): one request, its
  observations inline (a remote worker; a local one rings a doorbell instead);
* :class:`Actions` (``act``, collector -> env worker): the policy's outputs and the
  version of the weights that chose them;
* :class:`EnvChunk` (``chunk``, env worker -> collector): ``[envs, chunk_steps]``
  transitions, a TensorDict;
* :class:`EnvClose` (``close``, collector -> env worker): stop stepping.

An env worker's error is the one :class:`~asyncrl._protocol.collection.ErrorReport`
(torch-side: an env worker sends its body, :class:`transports.ErrorPayload`'s, with
``kind=ERROR_KIND``).

Every size is bounded by what the receiving side agreed at join (the layout it asked
for, its slot's rows and the chunk length), never by what the peer claims: each
``from_body`` takes those as keyword bounds (see :func:`~.decoding.decode`).
Torch-free: an env worker imports this module without torch; :class:`EnvChunk` (read by
the collector only) imports it when it reads one.

>>> layout = {"o0": ("float32", (2, 3))}
>>> class A:  # anything with a dtype and a shape: a tensor, a numpy array
...     dtype, shape = "float32", (2, 3)
>>> list(Observations.from_body({"o0": A()}, layout=layout).arrays)
['o0']
>>> try:
...     Observations.from_body({"o0": A(), "o1": A()}, layout=layout)
... except ProtocolError as exc:
...     print(exc)
obs message must hold exactly {'o0': float32[2, 3]}, got keys ['o0', 'o1']
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Self

from msgspec import Meta

from transports import ProtocolError, printable

from .decoding import read
from .fields import MAX_KEY

if TYPE_CHECKING:
    from tensordict import TensorDictBase

__all__ = ["DTYPES", "ERROR_KIND", "MAX_DIMS", "MAX_ELEMENTS", "MAX_TAG", "WRITES_INFOS", "Actions",
           "EnvChunk", "EnvClose", "EnvLayout", "EnvWelcome", "Observations", "array_problem",
           "checked_entries", "dtype_name"]

#: The dtypes a block (shared memory, or inline) holds: what a layout may name.
DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128", "bfloat16")
DtypeName = Literal["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32",
                    "uint64", "float16", "float32", "float64", "complex64", "complex128",
                    "bfloat16"]
#: Most dimensions of one observation or output, and elements of a whole layout.
MAX_DIMS = 16
MAX_ELEMENTS = 1 << 28
#: Most observation keys (and policy outputs) a layout may have.
MAX_ENTRIES = 256
#: Most served modules one welcome names.
MAX_SERVED = 64
#: :class:`~asyncrl._protocol.collection.ErrorReport`'s kind, for a torch-free env worker.
ERROR_KIND = "error"
#: What an env host that writes the info columns its welcome names
#: (:attr:`EnvWelcome.infos`) says in its hello's ``rollout`` (that option, applied from
#: the welcome). A host of an earlier release says nothing there, so a collector with
#: ``info_keys`` refuses it at its hello rather than at its first chunk; a collector of
#: an earlier release sees the option at its default, as before.
WRITES_INFOS: dict[str, Any] = {"info_keys": None}
#: Trajectory ids are ``tag << 32 | counter`` in an int64: tags stay below 2**31.
MAX_TAG = (1 << 31) - 1

Dim = Annotated[int, Meta(ge=0, le=1 << 31)]
Shape = Annotated[list[Dim], Meta(max_length=MAX_DIMS)]
Key = Annotated[str, Meta(min_length=1, max_length=MAX_KEY)]
KeyPath = Annotated[list[Key], Meta(min_length=1, max_length=MAX_DIMS)]
Entry = tuple[DtypeName, Shape]
#: The dtypes an info entry may have (numbers and bools: what ``info_keys`` reads).
InfoDtype = Literal["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32",
                    "uint64", "float16", "float32", "float64"]
#: One info leaf a worker writes per env and step: its key path under ``"next"``, its
#: dtype and its per-env shape.
InfoEntry = tuple[KeyPath, InfoDtype, Shape]


#: A chunk's flags and what the collector stamps: every chunk holds them.
_FLAGS = ("done", "terminated", "truncated")
#: What a chunk holds under ``"next"`` besides the observations' twins and the infos.
_BATCH_NEXT = ("reward", *_FLAGS)


def dtype_name(dtype: Any) -> str:
    """A dtype's name, whoever made it: ``torch.float32``, ``np.dtype("float32")``, ``"float32"``.

    >>> dtype_name("bfloat16")
    'bfloat16'
    """
    return str(dtype).removeprefix("torch.")


def _elements(shapes: list[list[int]] | Any) -> int:
    return sum(math.prod(shape) for shape in shapes)


def _check_elements(shapes: Any, what: str) -> None:
    total = _elements(shapes)
    if total > MAX_ELEMENTS:
        raise ProtocolError(f"{what}: {total} elements in all, more than the {MAX_ELEMENTS} "
                            "a layout may hold")


@dataclass(slots=True)
class EnvLayout:
    """An env worker's envs, as its hello's ``specs`` says them (``role="env"``).

    ``envs`` envs; ``obs``: (dtype, per-env shape) of each observation, in the order of
    the collector's observation keys; ``action``: (dtype, per-env shape). The collector
    compares it with its own (:meth:`problems`); ``max_envs`` (its ``max_batch_size``)
    bounds ``envs``.

    >>> layout = EnvLayout(envs=2, obs=[("float32", [3])], action=("float32", [1]))
    >>> EnvLayout.from_specs(layout.to_specs(), max_envs=8) == layout
    True
    >>> layout.problems(EnvLayout(envs=2, obs=[("float32", [4])], action=("float32", [1])))
    ["envs: this collector's observations are [('float32', [4])], the worker's [('float32', [3])]"]
    """

    KIND: ClassVar[str] = "hello specs"
    envs: Annotated[int, Meta(ge=1, le=1 << 20)]
    obs: Annotated[list[Entry], Meta(max_length=MAX_ENTRIES)]
    action: Entry

    def to_specs(self) -> dict[str, Any]:
        return {"envs": self.envs, "obs": [[d, list(s)] for d, s in self.obs],
                "action": [self.action[0], list(self.action[1])]}

    @classmethod
    def from_specs(cls, specs: Any, *, max_envs: int) -> Self:
        layout = read(cls, specs, "hello specs")
        layout.obs = [(d, list(s)) for d, s in layout.obs]
        layout.action = (layout.action[0], list(layout.action[1]))
        if layout.envs > max_envs:
            raise ProtocolError(f"hello specs field 'envs' must be an int in 1..{max_envs} "
                                f"(this collector's max_batch_size), got {layout.envs}")
        _check_elements([[layout.envs, *s] for _, s in [*layout.obs, layout.action]],
                        "hello specs")
        return layout

    def problems(self, ours: EnvLayout) -> list[str]:
        """What differs from ``ours`` (the collector's; its ``envs`` is not compared)."""
        problems = []
        if self.obs != ours.obs:
            problems.append(f"envs: this collector's observations are "
                            f"{[(d, s) for d, s in ours.obs]}, the worker's "
                            f"{[(d, s) for d, s in self.obs]}")
        if self.action != ours.action:
            problems.append(f"envs: this collector's action is {ours.action}, the worker's "
                            f"{self.action}")
        return problems


@dataclass(slots=True)
class EnvWelcome:
    """Collector -> env worker: admitted; where it sits and what its answers hold.

    ``slot``: its place in the inference loop (its chunks' ``worker_id``);
    ``traj_tag``: the high 32 bits of its ``traj_ids`` (a slot's later occupants get
    fresh ones); ``chunk_steps``: steps per chunk; ``obs_paths`` / ``extra_paths``: the
    key paths of the observations and of the policy's extra outputs; ``act``: the
    answer's layout, ``{key: (dtype, [envs, *shape])}``; ``infos``: the info leaves its
    chunks must hold (the collector's ``info_keys``, their specs fixed by the trainer),
    each ``(path, dtype, per-env shape)``, written as ``("next", *path)``.

    >>> welcome = EnvWelcome(slot=1, traj_tag=1, chunk_steps=4, obs_paths=[["observation"]],
    ...                      extra_paths=[], act={"action": ("int64", [2])},
    ...                      infos=[(["episode", "r"], "float64", [])])
    >>> EnvWelcome.from_body(welcome.to_body()).infos
    [(['episode', 'r'], 'float64', [])]
    >>> "infos" in EnvWelcome(slot=1, traj_tag=1, chunk_steps=4, obs_paths=[], extra_paths=[],
    ...                       act={"action": ("int64", [2])}).to_body()  # none: as before
    False
    >>> welcome.infos = [(["observation", "x"], "float64", [])]
    >>> try:
    ...     EnvWelcome.from_body(welcome.to_body())
    ... except ProtocolError as exc:
    ...     print(exc)  # doctest: +ELLIPSIS
    env_welcome message field 'infos' names ('observation', 'x'), which clashes with ...
    """

    KIND: ClassVar[str] = "env_welcome"
    slot: Annotated[int, Meta(ge=0, le=1 << 20)]
    traj_tag: Annotated[int, Meta(ge=0, le=MAX_TAG)]
    chunk_steps: Annotated[int, Meta(ge=1, le=1 << 16)]
    obs_paths: Annotated[list[KeyPath], Meta(max_length=MAX_ENTRIES)]
    extra_paths: Annotated[list[KeyPath], Meta(max_length=MAX_ENTRIES)]
    act: Annotated[dict[Key, Entry], Meta(min_length=1, max_length=MAX_ENTRIES + 1)]
    #: Its index in the collector's roster (an env worker's is its slot: its
    #: ``statistics()`` row's index) and the hello's attempt.
    index: int = 0
    attempt: int = 0
    #: The served modules it may call over its link: each a
    #: :class:`~asyncrl._protocol.served.ServedRoute`'s config (read there: the host
    #: checks each with ``ServedRoute.from_config``). Left out of the body when empty,
    #: and ignored by a host of an earlier release (unknown fields are).
    served: Annotated[list[dict[str, Any]], Meta(max_length=MAX_SERVED)] = field(
        default_factory=list)
    #: The info leaves its chunks hold (``info_keys``). Left out of the body when empty; a
    #: host of an earlier release ignores it, and its chunks (without them) are refused.
    infos: Annotated[list[InfoEntry], Meta(max_length=MAX_ENTRIES)] = field(
        default_factory=list)
    #: The collector's ``compact_obs=True``: its chunks hold no ``("next", obs)`` twins.
    #: Left out of the body when False; a host of an earlier release ignores it, and its
    #: chunks (with the twins) are refused, saying so.
    compact_obs: bool = False

    def to_body(self) -> dict[str, Any]:
        body = asdict(self)
        body["act"] = {k: [d, list(s)] for k, (d, s) in self.act.items()}
        body["infos"] = [[list(p), d, list(s)] for p, d, s in self.infos]
        for name in ("served", "infos", "compact_obs"):
            if not body[name]:
                del body[name]
        return body

    @classmethod
    def from_body(cls, body: Any) -> Self:
        welcome = read(cls, body, "env_welcome")
        welcome.obs_paths = [list(p) for p in welcome.obs_paths]
        welcome.extra_paths = [list(p) for p in welcome.extra_paths]
        if "action" not in welcome.act:
            raise ProtocolError("env_welcome message field 'act' must hold 'action', got "
                                f"{sorted(welcome.act)[:8]}")
        _check_elements([s for _, s in welcome.act.values()], "env_welcome act")
        welcome.infos = [(list(p), d, list(s)) for p, d, s in welcome.infos]
        _check_elements([s for _, _, s in welcome.infos], "env_welcome infos")
        taken = {tuple(p) for p in welcome.obs_paths} | {(k,) for k in _BATCH_NEXT}
        paths = [tuple(p) for p, _, _ in welcome.infos]
        for i, path in enumerate(paths):
            # ("next", *path) must be a leaf of its own: not a flag, not an observation's
            # twin, not inside or around another info leaf.
            if any(path[:len(other)] == other or other[:len(path)] == path
                   for other in [*taken, *paths[:i]]):
                raise ProtocolError(f"env_welcome message field 'infos' names "
                                    f"{printable(str(path), limit=200)}, which clashes "
                                    "with another entry under 'next'")
        return welcome


def array_problem(value: Any, dtype: str, shape: tuple[int, ...]) -> str:
    """Why ``value`` is not a ``dtype`` array of ``shape`` ("" if it is)."""
    got_dtype, got_shape = getattr(value, "dtype", None), getattr(value, "shape", None)
    if got_dtype is None or got_shape is None or isinstance(value, Mapping | str | bytes):
        return type(value).__name__
    got = (dtype_name(got_dtype), tuple(got_shape))
    return "" if got == (dtype, tuple(shape)) else f"{got[0]}{list(got[1])}"


def checked_entries(body: Any, layout: Mapping[str, tuple[str, tuple[int, ...]]], what: str,
                    convert: Callable[[Any], Any] | None = None,
                    problem: Callable[[Any, str, tuple[int, ...]], str] = array_problem
                    ) -> dict[str, Any]:
    """``body``'s entries, exactly ``layout``'s keys, each (after ``convert``) without a
    ``problem`` against its ``(dtype, shape)``; else one ProtocolError naming expected and got.

    >>> checked_entries({"x": 1}, {"x": ("float32", (2,))}, "obs")
    Traceback (most recent call last):
    ...
    transports._errors.ProtocolError: obs must hold exactly {'x': float32[2]}, got {'x': int}
    """
    expected = "{" + ", ".join(f"{k!r}: {d}{list(s)}" for k, (d, s) in layout.items()) + "}"
    if not isinstance(body, Mapping):
        raise ProtocolError(f"{what} must be a map {expected}, got {type(body).__name__}")
    if set(body) != set(layout):
        keys = sorted(printable(str(k), limit=32) for k in list(body)[:8])
        raise ProtocolError(f"{what} must hold exactly {expected}, got keys {keys}")
    entries = {k: body[k] if convert is None else convert(body[k]) for k in layout}
    bad = {k: found for k, (d, s) in layout.items() if (found := problem(entries[k], d, s))}
    if bad:
        got = ", ".join(f"{printable(str(k), limit=32)!r}: {p}"
                        for k, p in list(bad.items())[:8])
        raise ProtocolError(f"{what} must hold exactly {expected}, got {{{got}}}")
    return entries


@dataclass(slots=True)
class Observations:
    """Env worker -> collector: one request, its observations inline (``{"o<i>": array}``).

    ``layout`` (``{key: (dtype, shape)}``): what the collector agreed at join.
    """

    KIND: ClassVar[str] = "obs"
    arrays: dict[str, Any]

    def to_body(self) -> dict[str, Any]:
        return self.arrays

    @classmethod
    def from_body(cls, body: Any, *, layout: Mapping[str, tuple[str, tuple[int, ...]]],
                  convert: Callable[[Any], Any] | None = None) -> Self:
        return cls(checked_entries(body, layout, "obs message", convert))


@dataclass(slots=True)
class Actions:
    """Collector -> env worker: the policy's outputs for its last request, and their version.

    ``layout``: the answer's layout the welcome gave; ``convert``: how the worker turns
    a decoded value into the array it compares (a tensor into numpy's view of its bytes).
    """

    KIND: ClassVar[str] = "act"
    version: int
    arrays: dict[str, Any]

    def to_body(self) -> dict[str, Any]:
        return {"v": self.version, "a": self.arrays}

    @classmethod
    def from_body(cls, body: Any, *, layout: Mapping[str, tuple[str, tuple[int, ...]]],
                  convert: Callable[[Any], Any] | None = None) -> Self:
        if not isinstance(body, Mapping):
            raise ProtocolError(f"act message body must be a map, got {type(body).__name__}")
        version = body.get("v")
        if not isinstance(version, int) or isinstance(version, bool) \
                or not 0 <= version < 1 << 63:
            raise ProtocolError(f"act message field 'v' must be a policy version (an int >= "
                                f"0), got {type(version).__name__}")
        return cls(version, checked_entries(body.get("a"), layout, "act message field 'a'",
                                            convert))


@dataclass(slots=True)
class EnvClose:
    """Collector -> env worker: stop stepping, the run is over (no body)."""

    KIND: ClassVar[str] = "close"

    def to_body(self) -> None:
        return None

    @classmethod
    def from_body(cls, body: Any) -> Self:
        if body not in (None, {}):
            raise ProtocolError(f"close message carries no body, got {type(body).__name__}")
        return cls()





@dataclass(slots=True)
class EnvChunk:
    """Env worker -> collector: ``[rows, chunk_steps]`` transitions, a TensorDict.

    ``schema`` (``{key path: (torch dtype, shape)}``: every entry, as the worker's layout
    makes them), ``tag`` (its traj tag: the high 32 bits of every ``traj_ids``) and
    ``max_version`` (the newest weights it can have been answered with) are the
    collector's; a chunk that holds anything else is refused whole.
    """

    KIND: ClassVar[str] = "chunk"
    data: TensorDictBase

    def to_body(self) -> TensorDictBase:
        return self.data

    @classmethod
    def from_body(cls, body: Any, *, schema: Mapping[tuple[str, ...], tuple[Any, tuple[int, ...]]],
                  tag: int, max_version: int) -> Self:
        import torch
        from tensordict import TensorDictBase

        lead = next((s[:2] for _, s in schema.values()), ())
        if not isinstance(body, TensorDictBase) or tuple(body.batch_size) != tuple(lead):
            size = list(body.batch_size) if isinstance(body, TensorDictBase) \
                else type(body).__name__
            raise ProtocolError(f"chunk message must be a TensorDict of batch size "
                                f"{list(lead)}, got {size}")
        got: dict[tuple[str, ...], Any] = {(k,) if isinstance(k, str) else tuple(k): body.get(k)
               for k in body.keys(include_nested=True, leaves_only=True)}
        bad = sorted(printable(str(p), limit=200) for p in set(schema) ^ set(got))[:8] or sorted(
            f"{p}: expected {dtype_name(d)}{list(s)}, got "
            f"{array_problem(got[p], dtype_name(d), s) or 'it'}"
            for p, (d, s) in schema.items()
            if not isinstance(got[p], torch.Tensor) or got[p].dtype != d
            or tuple(got[p].shape) != tuple(s))[:8]
        if bad:
            raise ProtocolError(f"chunk message: wrong entries {bad}")
        traj, versions = got[("collector", "traj_ids")], got[("collector", "policy_version")]
        if bool(((traj >> 32) != tag).any()):
            raise ProtocolError(f"chunk message: ('collector', 'traj_ids') must carry its "
                                f"traj_tag {tag} in their high 32 bits (an env host older "
                                "than this collector ignores it: update asyncrl there)")
        if bool(((versions < 0) | (versions > max_version)).any()):
            raise ProtocolError(f"chunk message: ('collector', 'policy_version') must be "
                                f"versions it was answered with (0..{max_version}), got up "
                                f"to {int(versions.max())}")
        return cls(body)

    @staticmethod
    def schema(obs: list[tuple[tuple[str, ...], Any, tuple[int, ...]]],
               outputs: list[tuple[tuple[str, ...], Any, tuple[int, ...]]], *, rows: int,
               steps: int, flag: Any, reward: Any, counter: Any,
               infos: Sequence[tuple[tuple[str, ...], Any, tuple[int, ...]]] = (),
               next_observations: bool = True
               ) -> dict[tuple[str, ...], tuple[Any, tuple[int, ...]]]:
        """The entries of a ``[rows, steps]`` chunk: each observation (and its
        ``("next", ...)`` twin, unless ``next_observations=False``: ``compact_obs``), each
        output (``("action",)`` first), the flags, the reward, each info leaf asked
        (``("next", *path)``) and the collector's counters, as (dtype, shape) with the
        given dtypes."""
        lead = (rows, steps)
        schema: dict[tuple[str, ...], tuple[Any, tuple[int, ...]]] = {}
        for path, dtype, shape in obs:
            schema[path] = (dtype, (*lead, *shape))
            if next_observations:
                schema[("next", *path)] = (dtype, (*lead, *shape))
        for path, dtype, shape in outputs:
            schema[path] = (dtype, (*lead, *shape))
        for name in _FLAGS:
            schema[(name,)] = schema[("next", name)] = (flag, (*lead, 1))
        schema[("next", "reward")] = (reward, (*lead, 1))
        for path, dtype, shape in infos:
            schema[("next", *path)] = (dtype, (*lead, *shape))
        for name in ("traj_ids", "policy_version", "worker_id"):
            schema[("collector", name)] = (counter, lead)
        return schema
