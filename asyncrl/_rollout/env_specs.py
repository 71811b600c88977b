"""Plain, msgpack-able descriptions of what an env pool produces and consumes.

`ArraySpec` and `EnvSpecs` travel in the worker's hello message, so they hold
only builtins and `EnvSpecs.from_dict` treats its input as hostile: it checks
every type, bounds depth, key counts and sizes, and names the offending field.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np

__all__ = [
    "ALLOWED_DTYPES",
    "ArraySpec",
    "EnvSpecs",
    "ObsSpecTree",
    "array_spec_from_space",
    "flatten_obs_specs",
    "observation_specs_from_space",
]

#: numpy dtype names an `ArraySpec` may carry (a whitelist: specs come from peers).
ALLOWED_DTYPES = frozenset(
    {
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    }
)

# Limits for specs decoded from the network: generous for real envs, small
# enough that a hostile hello cannot make us build huge structures.
_MAX_NDIM = 32
_MAX_DIM = 2**31 - 1
_MAX_DEPTH = 8
_MAX_KEYS = 1024
_MAX_BOUND_ITEMS = 1 << 20

Bound: TypeAlias = float | tuple[float, ...] | None
ObsSpecTree: TypeAlias = Mapping[str, "ArraySpec | ObsSpecTree"]


def _is_int(x: object) -> bool:
    # bool is an int subclass; a peer sending True for a dimension is a bug.
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


@dataclass(frozen=True)
class ArraySpec:
    """Shape, dtype and bounds of one array of one env (no batch dimension).

    ``low``/``high`` are a float when uniform over the array, a flat tuple of
    ``prod(shape)`` floats when not, or None when unbounded on that side.
    ``n`` is set for a Discrete space (values ``low .. low + n - 1``).
    ``one_hot`` marks TorchRL's ``OneHot`` actions: the last dim holds one 1 (of
    ``shape[-1]`` categories), the others 0.

    >>> spec = ArraySpec(shape=(), dtype="int64", low=0.0, high=1.0, n=2)
    >>> ArraySpec.from_dict(spec.to_dict()) == spec
    True
    """

    shape: tuple[int, ...]
    dtype: str
    low: Bound = None
    high: Bound = None
    n: int | None = None
    one_hot: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def bounds(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """``(low, high)`` as float64 arrays of ``shape`` (None when unbounded)."""
        return self._bound_array(self.low), self._bound_array(self.high)

    def _bound_array(self, bound: Bound) -> np.ndarray | None:
        if bound is None:
            return None
        if isinstance(bound, tuple):
            return np.asarray(bound, dtype=np.float64).reshape(self.shape)
        return np.full(self.shape, bound, dtype=np.float64)

    def to_dict(self) -> dict[str, Any]:
        def enc(b: Bound) -> float | list[float] | None:
            return list(b) if isinstance(b, tuple) else b

        out = {
            "kind": "array",
            "shape": list(self.shape),
            "dtype": self.dtype,
            "low": enc(self.low),
            "high": enc(self.high),
            "n": self.n,
        }
        if self.one_hot:  # only then: a peer without one-hot support sees what it knows
            out["one_hot"] = True
        return out

    @classmethod
    def from_dict(cls, d: object, *, field: str = "spec") -> ArraySpec:
        """Validate and build; ``field`` names the spec in error messages."""
        if not isinstance(d, Mapping):
            raise ValueError(f"{field}: expected a map, got {type(d).__name__}")
        unknown = set(d) - {"kind", "shape", "dtype", "low", "high", "n", "one_hot"}
        if unknown:
            raise ValueError(f"{field}: unknown fields {sorted(map(str, unknown))}")
        if d.get("kind", "array") != "array":
            raise ValueError(f"{field}.kind: expected 'array', got {d.get('kind')!r}")
        shape = _check_shape(d.get("shape"), f"{field}.shape")
        dtype = d.get("dtype")
        if not isinstance(dtype, str) or dtype not in ALLOWED_DTYPES:
            raise ValueError(
                f"{field}.dtype: expected one of {sorted(ALLOWED_DTYPES)}, got {dtype!r}"
            )
        numel = math.prod(shape)
        low = _check_bound(d.get("low"), numel, f"{field}.low")
        high = _check_bound(d.get("high"), numel, f"{field}.high")
        n = d.get("n")
        if n is not None and (not _is_int(n) or n <= 0):
            raise ValueError(f"{field}.n: expected a positive int or None, got {n!r}")
        one_hot = d.get("one_hot", False)
        if not isinstance(one_hot, bool) or (one_hot and (not shape or shape[-1] < 1)):
            raise ValueError(f"{field}.one_hot: expected a bool (True only with a last dim "
                             f"of categories), got {one_hot!r} for shape {list(shape)}")
        return cls(shape=shape, dtype=dtype, low=low, high=high, n=n, one_hot=one_hot)


def _check_shape(shape: object, field: str) -> tuple[int, ...]:
    if not isinstance(shape, list | tuple) or len(shape) > _MAX_NDIM:
        raise ValueError(f"{field}: expected a list of at most {_MAX_NDIM} ints, got {shape!r}")
    if not all(_is_int(s) and 0 <= s <= _MAX_DIM for s in shape):
        raise ValueError(f"{field}: expected non-negative ints, got {shape!r}")
    return tuple(shape)


def _check_bound(b: object, numel: int, field: str) -> Bound:
    if b is None:
        return None
    if _is_number(b):
        return float(b)  # type: ignore[arg-type]
    if isinstance(b, list | tuple):
        if len(b) != numel or len(b) > _MAX_BOUND_ITEMS:
            raise ValueError(f"{field}: expected {numel} numbers, got a list of {len(b)}")
        if not all(_is_number(x) for x in b):
            raise ValueError(f"{field}: expected numbers only")
        return tuple(float(x) for x in b)
    raise ValueError(f"{field}: expected a number, a list of numbers or None, got {b!r}")


@dataclass(frozen=True)
class EnvSpecs:
    """What one env pool produces and consumes, for handshakes and buffers.

    ``observation`` is keyed by output key: ``"observation"`` for Box and
    Discrete spaces, one key per sub-space for a gymnasium ``Dict`` (nested
    Dict -> nested dict).

    >>> obs = {"observation": ArraySpec(shape=(4,), dtype="float32")}
    >>> act = ArraySpec(shape=(), dtype="int64", low=0.0, high=1.0, n=2)
    >>> specs = EnvSpecs(observation=obs, action=act, num_envs=8)
    >>> EnvSpecs.from_dict(specs.to_dict()) == specs
    True
    >>> specs.describe_mismatch(EnvSpecs(observation=obs, action=act, num_envs=4))
    ['num_envs: 8 != 4']
    """

    observation: ObsSpecTree
    action: ArraySpec
    num_envs: int

    def flat_observation(self) -> dict[tuple[str, ...], ArraySpec]:
        """Observation specs keyed by key path, depth first in declaration order."""
        return dict(flatten_obs_specs(self.observation))

    def to_dict(self) -> dict[str, Any]:
        """Only dict/list/str/int/float/bool/None: safe to msgpack."""
        return {
            "observation": _obs_to_dict(self.observation),
            "action": self.action.to_dict(),
            "num_envs": self.num_envs,
        }

    @classmethod
    def from_dict(cls, d: object) -> EnvSpecs:
        """Validate a decoded map (possibly from a peer); ValueError names the field."""
        if not isinstance(d, Mapping):
            raise ValueError(f"EnvSpecs: expected a map, got {type(d).__name__}")
        unknown = set(d) - {"observation", "action", "num_envs"}
        if unknown:
            raise ValueError(f"EnvSpecs: unknown fields {sorted(map(str, unknown))}")
        num_envs = d.get("num_envs")
        if not _is_int(num_envs) or num_envs <= 0:  # type: ignore[operator]
            raise ValueError(f"EnvSpecs.num_envs: expected a positive int, got {num_envs!r}")
        counter = [0]
        observation = _obs_from_dict(d.get("observation"), "EnvSpecs.observation", 0, counter)
        if not observation:
            raise ValueError("EnvSpecs.observation: expected at least one key")
        action = ArraySpec.from_dict(d.get("action"), field="EnvSpecs.action")
        return cls(observation=observation, action=action, num_envs=num_envs)  # type: ignore[arg-type]

    def describe_mismatch(self, other: EnvSpecs, *, include_num_envs: bool = True) -> list[str]:
        """Human-readable differences, one per field: ``'<field>: <ours> != <theirs>'``."""
        out: list[str] = []
        if include_num_envs and self.num_envs != other.num_envs:
            out.append(f"num_envs: {self.num_envs} != {other.num_envs}")
        out += _spec_mismatch(self.action, other.action, "action")
        ours, theirs = self.flat_observation(), other.flat_observation()
        for path in ours.keys() | theirs.keys():
            name = "observation" + "".join(f"[{p!r}]" for p in path)
            if path not in theirs:
                out.append(f"{name}: present != missing")
            elif path not in ours:
                out.append(f"{name}: missing != present")
            else:
                out += _spec_mismatch(ours[path], theirs[path], name)
        return sorted(out)


def _spec_mismatch(a: ArraySpec, b: ArraySpec, name: str) -> list[str]:
    return [
        f"{name}.{f}: {getattr(a, f)!r} != {getattr(b, f)!r}"
        for f in ("shape", "dtype", "low", "high", "n", "one_hot")
        if getattr(a, f) != getattr(b, f)
    ]


def flatten_obs_specs(
    tree: ObsSpecTree, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], ArraySpec]]:
    """Yield ``(key_path, spec)`` for every leaf of an observation spec tree."""
    for key, value in tree.items():
        if isinstance(value, ArraySpec):
            yield (*prefix, key), value
        else:
            yield from flatten_obs_specs(value, (*prefix, key))


def _obs_to_dict(tree: ObsSpecTree) -> dict[str, Any]:
    return {
        k: v.to_dict() if isinstance(v, ArraySpec) else {"kind": "dict", "items": _obs_to_dict(v)}
        for k, v in tree.items()
    }


def _obs_from_dict(d: object, field: str, depth: int, counter: list[int]) -> dict[str, Any]:
    if depth > _MAX_DEPTH:
        raise ValueError(f"{field}: nested deeper than {_MAX_DEPTH} levels")
    if not isinstance(d, Mapping):
        raise ValueError(f"{field}: expected a map, got {type(d).__name__}")
    out: dict[str, Any] = {}
    for key, value in d.items():
        counter[0] += 1
        if counter[0] > _MAX_KEYS:
            raise ValueError(f"{field}: more than {_MAX_KEYS} keys")
        if not isinstance(key, str) or not key:
            raise ValueError(f"{field}: keys must be non-empty strings, got {key!r}")
        sub = f"{field}[{key!r}]"
        if isinstance(value, Mapping) and value.get("kind") == "dict":
            if set(value) != {"kind", "items"}:
                raise ValueError(f"{sub}: a dict entry has exactly 'kind' and 'items'")
            out[key] = _obs_from_dict(value["items"], sub, depth + 1, counter)
        else:
            out[key] = ArraySpec.from_dict(value, field=sub)
    return out


# -- gymnasium spaces -> specs ------------------------------------------------------------


def _bound(values: np.ndarray, unbounded: float) -> Bound:
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    if flat.size and np.all(flat == unbounded):
        return None
    if flat.size and np.all(flat == flat[0]):
        return float(flat[0])
    return tuple(float(x) for x in flat)


def array_spec_from_space(space: Any) -> ArraySpec:
    """ArraySpec of a gymnasium Box / Discrete / MultiDiscrete / MultiBinary space."""
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        start, n = int(space.start), int(space.n)
        return ArraySpec((), np.dtype(space.dtype).name, float(start), float(start + n - 1), n)
    if isinstance(space, spaces.Box):
        dtype = np.dtype(space.dtype).name
        return ArraySpec(
            tuple(space.shape), dtype, _bound(space.low, -np.inf), _bound(space.high, np.inf)
        )
    if isinstance(space, spaces.MultiDiscrete):
        lowest = np.broadcast_to(space.start, space.shape)
        return ArraySpec(
            tuple(space.shape),
            np.dtype(space.dtype).name,
            _bound(lowest, -np.inf),
            _bound(lowest + space.nvec - 1, np.inf),
        )
    if isinstance(space, spaces.MultiBinary):
        return ArraySpec(tuple(space.shape), np.dtype(space.dtype).name, 0.0, 1.0)
    raise ValueError(
        f"unsupported gymnasium space {type(space).__name__}: expected Box, Discrete, "
        "MultiDiscrete, MultiBinary (or Dict of them for observations)"
    )


def observation_specs_from_space(space: Any) -> dict[str, Any]:
    """Observation spec tree: ``{"observation": spec}`` or one key per Dict sub-space."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        return _dict_space_specs(space)
    return {"observation": array_spec_from_space(space)}


def _dict_space_specs(space: Any) -> dict[str, Any]:
    from gymnasium import spaces

    out: dict[str, Any] = {}
    for key, sub in space.spaces.items():
        if not isinstance(key, str):
            raise ValueError(f"Dict observation keys must be strings, got {key!r}")
        out[key] = (
            _dict_space_specs(sub) if isinstance(sub, spaces.Dict) else array_spec_from_space(sub)
        )
    return out
