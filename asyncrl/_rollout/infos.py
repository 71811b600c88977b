"""`InfoReader`: the named entries of gymnasium ``info`` dicts, into preallocated arrays.

TorchRL's ``default_info_dict_reader`` (``torchrl.envs.gym_like``, registered with
``GymWrapper.set_info_dict_reader``) writes the info entries it is given into the
step's output, which a collector's batch holds under ``"next"``; asyncrl's
``info_keys=`` does the same: info entry ``k`` of the step that produced frame t
is ``batch["next", k][:, t]``. An entry that is a dict (RecordEpisodeStatistics'
``episode``) becomes a nested TensorDict (``("next", "episode", "r")``); a tuple
key (``("episode", "r")``) takes one of its leaves. An env whose info lacks an
entry at a step gets zeros there (TorchRL fills missing entries from the spec),
as does a vector env's row whose mask (``info["_k"]``) is False.

Specs come from the first step, as TorchRL's ``set_info_dict_reader`` does: one
random step at construction (then a reset), and every later value is checked
against them (:class:`SpecMismatchError` naming the key). An entry absent at that
step needs its spec given (``info_keys={"is_success": "bool"}``), except
RecordEpisodeStatistics' ``episode`` / ``_episode``, whose specs are known.
The buffers are allocated once: reading an info costs dict lookups and copies.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .._errors import SpecMismatchError
from .keys import normalise_keys

__all__ = ["InfoReader", "InfoSpec", "normalise_info_keys", "refuse_observation_clash",
           "refuse_torchrl_pool"]

Path = tuple[str, ...]
#: ``(shape, dtype name)`` of one env's value of an info leaf.
InfoSpec = tuple[tuple[int, ...], str]
#: What ``info_keys`` normalises to: each asked key with its spec (None: learned).
InfoKeys = tuple[tuple[Path, InfoSpec | None], ...]

#: RecordEpisodeStatistics' entries (gymnasium's single and vector wrappers): present
#: only on the steps where an episode ends, so no first step can show them.
KNOWN_SPECS: dict[Path, InfoSpec] = {
    ("episode", "r"): ((), "float64"),
    ("episode", "l"): ((), "int64"),
    ("episode", "t"): ((), "float64"),
    ("_episode",): ((), "bool"),
}
_RESERVED = frozenset({"reward", "done", "terminated", "truncated", "observation"})
_ndarray = np.ndarray


def normalise_info_keys(keys: Any) -> InfoKeys | None:
    """``info_keys`` as ``((path, spec or None), ...)``; a clear error for anything else.

    >>> normalise_info_keys(["episode", ("stats", "x")])
    ((('episode',), None), (('stats', 'x'), None))
    >>> normalise_info_keys({"is_success": "bool", "pos": ((2,), "float32")})
    ((('is_success',), ((), 'bool')), (('pos',), ((2,), 'float32')))
    >>> normalise_info_keys(normalise_info_keys(["episode"]))   # its own output: the same
    ((('episode',), None),)
    """
    if keys is None:
        return None
    if isinstance(keys, tuple) and keys and all(
            isinstance(e, tuple) and len(e) == 2 and isinstance(e[0], tuple) for e in keys):
        # Already normalised (options copied with dataclasses.replace): no key is a
        # tuple holding a tuple, so this is checked again as the map it stands for.
        keys = dict(keys)
    specs: Mapping[Any, Any] = keys if isinstance(keys, Mapping) else {}
    names = normalise_keys("info_keys", list(specs) if specs else keys)
    assert names is not None
    out = []
    for name in names:
        path = (name,) if isinstance(name, str) else tuple(name)
        if path[0] in _RESERVED:
            raise ValueError(f"info_keys: {name!r} clashes with the batch's own ('next', "
                             f"{path[0]!r}); read another info entry")
        spec = specs.get(name, specs.get(path)) if specs else None
        out.append((path, None if spec is None else _spec(name, spec)))
    return tuple(out)


def _spec(name: Any, spec: Any) -> InfoSpec:
    """A dtype (a scalar per env), ``(shape, dtype)``, or anything with ``.shape`` / ``.dtype``."""
    shape: Any = ()
    if hasattr(spec, "shape") and hasattr(spec, "dtype"):  # a TorchRL spec, an array
        shape, spec = spec.shape, spec.dtype
    elif isinstance(spec, tuple) and len(spec) == 2:
        shape, spec = spec
    try:
        dtype = np.dtype(str(spec).removeprefix("torch."))
        shape = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise TypeError(f"info_keys[{name!r}]: expected a dtype or (shape, dtype), got "
                        f"{spec!r}") from None
    if dtype.kind not in "biuf":
        raise TypeError(f"info_keys[{name!r}]: {dtype} is not a number or bool dtype")
    return shape, dtype.name


class _Leaf:
    """One info leaf: its path, its ``[N, *shape]`` buffer and the mask broadcast to it."""

    __slots__ = ("arr", "key", "mask", "path", "row_shape")

    def __init__(self, path: Path, spec: InfoSpec, num_envs: int, mask: np.ndarray) -> None:
        self.path, self.key = path, ".".join(path)
        self.row_shape = spec[0]
        self.arr = np.zeros((num_envs, *spec[0]), dtype=spec[1])
        self.mask = mask.reshape(num_envs, *(1,) * len(spec[0]))  # a view, made once


class InfoReader:
    """Reads ``keys`` from each step's info into ``arrays`` (``[N, *shape]``, reused).

    Pools call `read_env` (one env's info dict) or `read_vector` (a vector env's,
    masks ``_k``); before `learn_done` they only learn the specs.

    >>> reader = InfoReader(normalise_info_keys(["steps"]), num_envs=2)
    >>> reader.read_env(0, {"steps": 3}); reader.read_env(1, {"steps": 4}); reader.learn_done()
    >>> reader.read_env(0, {"steps": 5}); reader.read_env(1, {})
    >>> reader.paths, reader.arrays[0].tolist()
    ([('steps',)], [5, 0])
    """

    def __init__(self, keys: InfoKeys, num_envs: int) -> None:
        self.num_envs = num_envs
        self._asked = keys
        self._specs: dict[Path, InfoSpec] = {}  # learned, path -> spec (leaves)
        self._learning = True
        self._leaves: list[_Leaf] = []
        self._mask = np.zeros(num_envs, dtype=bool)
        self.paths: list[Path] = []
        self.arrays: list[np.ndarray] = []

    # -- learning the specs (construction) ---------------------------------------------

    def _learn(self, prefix: Path, value: Any, vector: bool) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                if isinstance(k, str) and not (vector and k.startswith("_")):
                    self._learn((*prefix, k), v, vector)
            return
        arr = np.asarray(value)
        if arr.dtype.kind not in "biuf":
            raise TypeError(f"info entry {'.'.join(prefix)!r} holds {arr.dtype} values "
                            f"({type(value).__name__}): only numbers and bools go into a batch")
        shape = arr.shape[1:] if vector else arr.shape
        self._specs.setdefault(prefix, (tuple(shape), arr.dtype.name))

    def _learn_info(self, info: Any, vector: bool) -> None:
        for path, spec in self._asked:
            if spec is not None:
                self._specs[path] = spec
                continue
            found = _lookup(info, path)
            if found is not None:
                self._learn(path, found, vector)

    def learn_done(self) -> None:
        """Fix the specs (known ones for entries the first step lacked) and allocate."""
        for path, spec in self._asked:
            if spec is None and not any(p[:len(path)] == path for p in self._specs):
                known = {p: s for p, s in KNOWN_SPECS.items() if p[:len(path)] == path}
                if not known:
                    raise ValueError(
                        f"info_keys: {'.'.join(path)!r} was not in the first step's info, so its "
                        "shape and dtype are unknown: give them (info_keys={"
                        f"{path[-1]!r}: 'float32'}} or ((shape), dtype)), or check the name")
                self._specs.update(known)
        for path, spec in sorted(self._specs.items()):
            leaf = _Leaf(path, spec, self.num_envs, self._mask)
            self._leaves.append(leaf)
            self.paths.append(path)
            self.arrays.append(leaf.arr)
        self._learning = False

    # -- reading (every step) ---------------------------------------------------------

    def read_env(self, i: int, info: Any) -> None:
        """Env ``i``'s info dict (a single gymnasium env's step)."""
        if self._learning:
            self._learn_info(info, vector=False)
            return
        for leaf in self._leaves:
            value = _lookup(info, leaf.path)
            if value is None:
                leaf.arr[i] = 0
                continue
            if value.__class__ is not _ndarray or value.dtype is not leaf.arr.dtype \
                    or value.shape != leaf.row_shape:
                _check(leaf, value, vector=False)
            leaf.arr[i] = value

    def read_vector(self, info: Any, rows: Any = None) -> None:
        """A vector env's info (``[N, ...]`` values and ``_k`` masks); ``rows``: which
        envs its rows are (EnvPool's ``env_id``; None: all, in order)."""
        if self._learning:
            self._learn_info(info, vector=True)
            return
        for leaf in self._leaves:
            value, mask = _lookup_masked(info, leaf.path)
            if value is None:
                leaf.arr[slice(None) if rows is None else rows] = 0
                continue
            if value.__class__ is not _ndarray or value.dtype is not leaf.arr.dtype \
                    or value.shape[1:] != leaf.row_shape:
                _check(leaf, value, vector=True)
            if rows is not None:
                leaf.arr[rows] = value
                continue
            if mask is None:
                np.copyto(leaf.arr, value)
            else:
                np.copyto(self._mask, mask)
                leaf.arr.fill(0)
                np.copyto(leaf.arr, value, where=leaf.mask)

    def read_final(self, info: Any, done: np.ndarray) -> None:
        """SAME_STEP: a finished env's row is its terminal step's info (``final_info``),
        not its reset's; an entry only the vector's wrappers add stays as read."""
        final = info.get("final_info") if isinstance(info, Mapping) else None
        if self._learning or not isinstance(final, Mapping):
            return
        for i in np.flatnonzero(done):  # episode ends are rare: allocations are fine here
            for leaf in self._leaves:
                value, mask = _lookup_masked(final, leaf.path)
                if value is not None and (mask is None or mask[i]):
                    _check(leaf, value, vector=True)
                    leaf.arr[i] = value[i]


def _lookup(info: Any, path: Path) -> Any:
    node = info
    for p in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(p)
        if node is None:
            return None
    return node


def _lookup_masked(info: Any, path: Path) -> tuple[Any, Any]:
    """A vector info's value at ``path`` and its innermost mask ``_k`` (None: none)."""
    node, mask = info, None
    for p in path:
        if not isinstance(node, Mapping):
            return None, None
        mask = node.get("_" + p, mask)
        node = node.get(p)
        if node is None:
            return None, None
    return node, mask


def _check(leaf: _Leaf, value: Any, *, vector: bool) -> None:
    """The slow path: raise unless ``value`` goes into ``leaf`` without loss."""
    want, arr = leaf.arr.dtype, np.asarray(value)
    shape = arr.shape[1:] if vector else arr.shape
    if value.__class__ in (int, float, bool) and not leaf.row_shape and not vector:
        if np.can_cast(arr.dtype, want, casting="same_kind") or want.kind == "f":
            return
    elif shape == leaf.row_shape and np.can_cast(arr.dtype, want, casting="safe"):
        return
    raise SpecMismatchError(
        f"info entry {leaf.key!r}: the first step gave {want} of shape {leaf.row_shape}, this "
        f"step gave {arr.dtype} of shape {tuple(shape)}; an info entry must keep its shape and "
        f"dtype (or give its spec: info_keys={{{leaf.path!r}: ((shape), dtype)}})")


def refuse_torchrl_pool(pool: Any) -> None:
    """A pool that steps a TorchRL env reads no gymnasium info: say what to do instead."""
    if not pool.reads_info:
        raise ValueError(
            f"info_keys: {type(pool).__name__} steps a TorchRL env, whose info TorchRL reads "
            "itself: register env.set_info_dict_reader(default_info_dict_reader([...])) and "
            "the entries come as observations")


#: The seed of the random actions :func:`attach_info_reader` steps with. Fixed: that step
#: moves the envs and their wrappers' running statistics (``NormalizeObservation``), so
#: a draw from the system's entropy would make two runs with the same seeds differ.
PROBE_SEED = 0


def attach_info_reader(pool: Any, keys: InfoKeys | None) -> InfoReader | None:
    """Give ``pool`` a reader of ``keys`` and learn their specs from one random step.

    The step's actions come from a `RandomPolicy` of the pool's action spec seeded with
    :data:`PROBE_SEED` (not the rollout's own: its draws stay as they were); the pool is
    reset after. Called where torch is (a rollout, the trainer), never in a torch-free
    env worker, which only reads the columns the trainer learned.
    """
    if not keys:
        if getattr(pool, "info_reader", None) is not None:
            pool.info_reader = None  # an earlier admission's: this run reads no info
        return None
    refuse_torchrl_pool(pool)
    from .policies import RandomPolicy  # (torch: this module is imported torch-free too)

    random = RandomPolicy(pool.specs.action, seed=PROBE_SEED)
    reader = InfoReader(keys, pool.num_envs)
    pool.info_reader = reader
    act = pool.specs.action
    actions = np.zeros((pool.num_envs, *act.shape), dtype=act.dtype)
    pool.reset()
    random.sample_into(actions)
    pool.step_inplace(actions)
    reader.learn_done()
    refuse_observation_clash(reader, pool)
    pool.reset()
    return reader


def refuse_observation_clash(reader: InfoReader, pool: Any) -> None:
    """An info leaf named as one of ``pool``'s observations would overwrite its twin."""
    clash = [p for p in reader.paths if p in pool.obs_paths]
    if clash:
        raise ValueError(f"info_keys: {clash} are also observations: ('next', ...) holds "
                         "them already")


def info_buffers(reader: InfoReader | None, buf: Any) -> list[tuple[Path, Any, np.ndarray]]:
    """``(("next", *path), batch buffer, reader array)`` per leaf; ``buf(shape, dtype)``
    makes a batch buffer (a torch tensor)."""
    if reader is None:
        return []
    import torch

    return [(("next", *path), buf(arr.shape[1:], torch.from_numpy(arr[:0]).dtype), arr)
            for path, arr in zip(reader.paths, reader.arrays, strict=True)]
