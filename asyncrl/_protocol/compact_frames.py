"""A batch's compact wire form: ``("next", obs)`` is not shipped twice.

In TorchRL's layout ``("next", K)[n, t]`` is, almost always, ``K[n, t + 1]``:
the observation after a step is the one the next step starts from. So the
worker sends every key ``K`` once and, of ``("next", K)``, only the rows that
are *not* the following step's ``K``: the last step of each env (its follower
is in the next batch) and every step where the two differ bitwise (an episode
that ended, with the terminal observation before the reset; a policy that
edited an observation in place; anything else). The worker does not reason
about why they differ: it compares, once per batch, the two blocks as integers
(``-0.0``, NaNs and all), which costs a read of both next to the copy it
makes anyway. The receiver shifts ``K`` by one step and patches those rows:
the batch it rebuilds is bit-identical to the one compacted. Keys under
:data:`MIN_BYTES` per frame (a CPU env's few floats) ship whole: there the
compare, gather and shift cost more than the bytes they save.

Wire form (inside :class:`~asyncrl._protocol.Batch`'s body, ``"next"``):
``{"at": int64 [M], "rows": TensorDict [M]}``: ``at`` the flat positions
``n * T + t`` of the rows shipped, sorted and unique, ``rows`` their
``("next", K)`` values under ``K`` for every compacted key. The frames lack
those ``("next", K)`` entries.

Where the rebuild happens: in :meth:`Batch.from_body <asyncrl._protocol.Batch.from_body>`,
before anything else reads the batch. The coordinator's checks (shapes against
the env specs, ``info_keys``), the assembly of shares and every user see the
batch they always saw; the compact form never escapes the protocol layer, and
another path for the same frames (a local worker's batch in shared memory)
can call :func:`compact` / :func:`rebuild` or leave them out. With TorchRL's
``compact_obs=True`` nothing is rebuilt: a worker sends :func:`drop_twins`'s
batch (the welcome said so), which has no ``("next", K)`` to compact.

The compact-frame rule, owned here: which keys are twins (:func:`compactable_keys`,
:func:`twin_keys`: each ``("next", K)`` whose root ``K`` has its dtype and shape,
the done flags and ``"collector"`` excepted), what ``compact_obs=True`` makes of a batch
(:func:`drop_twins`: a view without them, idempotent) and how the compact wire form
is rebuilt (:func:`compact` / :func:`rebuild`). Nobody else decides which keys are
twins; three places call :func:`drop_twins`, each where only it can:

1. the worker (``_worker/outgoing.py``, another process), before the one copy it
   sends, when its welcome said ``compact_obs``: the twins are never copied nor sent;
2. the trainer's batch sink (``_coordinator/batch_sink.py``), on receipt, for a
   worker whose hello did not say it drops them (an earlier release): before the
   checks, which refuse a twin from a worker that said it drops them
   (``_coordinator/checks.py``, with :func:`twin_keys`), and before a sync round's
   shares are joined, so that they have one layout;
3. every collector's iteration (``collectors/_base.py``), when ``compact_obs`` is
   set: the in-process collector's batches, and a multi-process or batched
   collector's when ``compact_obs`` was set after construction (after opening, for
   the batched one; a no-op on the batches of workers told so).

The worker's rollout, told the same, does not even allocate the observations'
twins (``_rollout/buffers.py``, ``next_observations=False``): a saving, not a
decision; :func:`drop_twins` after it drops what it did not leave out. Nor do central
inference's env workers write them (``_inference/chunk_writer.py``, ``chunk_layout``):
their chunks leave out the observations' twins, the same entries this module names
(iteration's :func:`drop_twins` drops anything else a chunk twins: a no-op otherwise).

>>> import torch
>>> from tensordict import TensorDict
>>> obs = torch.arange(6.0).reshape(1, 6, 1)
>>> nxt = obs + 1
>>> nxt[0, 2] = -1.0  # an episode ended at step 2: terminal observation, then a reset
>>> frames = TensorDict({"observation": obs, ("next", "observation"): nxt}, [1, 6])
>>> wire, patch = compact(frames, min_bytes=0)
>>> patch["at"].tolist()  # step 2 and the last step
[2, 5]
>>> bool((rebuild(wire, patch)["next", "observation"] == nxt).all())
True
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from transports import ProtocolError, declared

__all__ = ["MIN_BYTES", "CompactPatch", "Patch", "compact", "compactable_keys", "drop_twins",
           "rebuild", "twin_keys"]

Key = tuple[str, ...]
#: ``{"at": Tensor, "rows": TensorDict}``: the shipped ``("next", K)`` rows (as written).
Patch = dict[str, Any]
_WHAT = "batch field 'next'"


@dataclass(frozen=True, slots=True)
class CompactPatch:
    """A patch as it arrives, declared (``Batch``'s wire form reads ``next`` as one): a
    tensor of positions and a TensorDict of one row per position. What it must match in
    the frames (range, every env's last step, keys, dtypes, shapes) is :func:`rebuild`'s
    check, which runs before anything is allocated.

    >>> CompactPatch(torch.tensor([1]), TensorDict({}, [1])).at.tolist()
    [1]
    """

    at: torch.Tensor
    rows: TensorDictBase

    def __post_init__(self) -> None:
        at, rows = self.at, self.rows
        if at.dtype != torch.int64 or at.ndim != 1:
            raise ProtocolError(f"{_WHAT} 'at' must be a 1-d int64 tensor, got {at.dtype} "
                                f"{list(at.shape)}")
        if list(rows.batch_size) != [at.numel()]:
            raise ProtocolError(f"{_WHAT} 'rows' must be a TensorDict of batch size "
                                f"[{at.numel()}] (one row per position in 'at'), got "
                                f"{list(rows.batch_size)}")

#: Keys smaller than this per frame are shipped whole: below it the per-batch compare,
#: gather and shift cost more than the bytes they save (Pendulum's 12-byte observation).
MIN_BYTES = 256
#: Root keys with a ``("next", ...)`` twin that are not the next step's value.
_NOT_OBSERVATIONS = frozenset({("done",), ("terminated",), ("truncated",)})
_WIDE = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def _path(key: str | tuple[str, ...]) -> Key:
    return (key,) if isinstance(key, str) else tuple(key)


def compactable_keys(frames: TensorDictBase, *, min_bytes: int = 0) -> list[Key]:
    """Root keys ``K`` (observations, recurrent states) whose ``("next", K)`` twin has
    their dtype and shape, at least ``min_bytes`` per frame; the flags excepted.

    These are also the keys TorchRL's ``compact_obs=True`` drops from ``"next"``.
    """
    twins = frames.get("next", None)
    if not isinstance(twins, TensorDictBase):
        return []
    keys, dims = [], frames.batch_dims
    for key, twin in twins.items(include_nested=True, leaves_only=True):
        path = _path(key)
        # Sizes first: the flags and the reward fall out before any lookup of their root.
        if path in _NOT_OBSERVATIONS or path[0] in ("next", "collector") \
                or twin.element_size() * twin.shape[dims:].numel() < max(min_bytes, 1):
            continue
        value = frames.get(path, None)
        if isinstance(value, torch.Tensor) and value.dtype == twin.dtype \
                and value.shape == twin.shape:
            keys.append(path)
    return keys


def twin_keys(frames: TensorDictBase) -> list[Key]:
    """The ``("next", K)`` entries TorchRL's ``compact_obs=True`` drops from ``frames``."""
    return [("next", *path) for path in compactable_keys(frames)]


def drop_twins(frames: TensorDictBase) -> TensorDictBase:
    """``frames`` without the entries of :func:`twin_keys` (no copy: the same tensors).

    TorchRL's ``compact_obs=True``, and the one way it is applied (see the module for
    its three call sites): what a worker told ``compact_obs`` in its welcome sends (or
    writes into its shared-memory slot) instead of the whole batch, what the trainer
    makes of a batch from a worker of an earlier release, and what a collector yields;
    so all are bit-identical. Idempotent: a batch without twins comes back as it is.

    >>> frames = TensorDict({"observation": torch.zeros(2, 3), ("next", "observation"):
    ...                      torch.ones(2, 3), ("next", "reward"): torch.ones(2, 1)}, [2])
    >>> sorted(map(str, drop_twins(frames).keys(include_nested=True, leaves_only=True)))
    ["('next', 'reward')", 'observation']
    """
    twins = twin_keys(frames)
    return frames.exclude(*twins) if twins else frames


def compact(frames: TensorDictBase, *,
            min_bytes: int = MIN_BYTES) -> tuple[TensorDictBase, Patch | None]:
    """An independent copy of ``[N, T]`` ``frames`` without the ``("next", K)`` rows
    that the following step's ``K`` repeats, and the patch of the others.

    The patch is None when nothing is worth compacting (no key of ``min_bytes``
    per frame, or an empty batch): the copy is then the whole batch.
    """
    keys = compactable_keys(frames, min_bytes=min_bytes) if frames.batch_dims == 2 else []
    n, t = frames.batch_size if frames.batch_dims == 2 else (0, 0)
    if not keys or n * t == 0:
        return frames.clone(), None
    differs = torch.zeros((n, t), dtype=torch.bool, device=frames.get(keys[0]).device)
    differs[:, -1] = True  # the follower of a batch's last step is in the next batch
    for path in keys:
        differs[:, :-1] |= _differ(frames.get(("next", *path))[:, :-1], frames.get(path)[:, 1:])
    at = differs.reshape(-1).nonzero().reshape(-1)
    rows = TensorDict({path: frames.get(("next", *path)).flatten(0, 1)[at] for path in keys},
                      batch_size=[at.numel()])
    wire = frames.exclude(*[("next", *path) for path in keys]).clone()
    return wire, {"at": at, "rows": rows}


def _differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[N, T']`` True where the rows of ``a`` and ``b`` differ in any bit."""
    n, t = a.shape[:2]
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.dtype is torch.bool:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    # Each row is contiguous in the rollout's buffers: compare it as the widest integers
    # its byte size allows (NaN == NaN, -0.0 != 0.0: bits, not values).
    a, b = a.reshape(n, t, -1), b.reshape(n, t, -1)
    if a.stride(-1) != 1 or b.stride(-1) != 1:
        a, b = a.contiguous(), b.contiguous()
    size = a.shape[-1] * a.element_size()
    wide = next(w for w in (8, 4, 2, 1) if size % w == 0)
    return (a.view(_WIDE[wide]) != b.view(_WIDE[wide])).any(-1)


def rebuild(frames: TensorDictBase, patch: CompactPatch | Patch) -> TensorDictBase:
    """``frames`` with ``("next", K)`` rebuilt for every key of ``patch`` (from a peer: checked).

    ``patch``: as :meth:`Batch.from_body <asyncrl._protocol.Batch.from_body>` decoded
    it, or its wire form (read here as a :class:`CompactPatch`). Raises
    :class:`transports.ProtocolError` naming what came and what was expected when
    the patch does not fit the frames; nothing is allocated before that check.
    """
    if not isinstance(patch, CompactPatch):
        _check_parts(patch)
        patch = declared.read(CompactPatch, patch, _WHAT)
    at, rows = _checked(frames, patch)
    n, t = frames.batch_size
    for key in rows.keys(include_nested=True, leaves_only=True):
        path = _path(key)
        now = frames.get(path)
        nxt = torch.empty(now.shape, dtype=now.dtype, device=now.device)  # contiguous: view
        nxt[:, :-1] = now[:, 1:]
        nxt.view(n * t, *now.shape[2:])[at] = rows.get(path)
        frames.set(("next", *path), nxt)
    return frames


def _check_parts(patch: Any) -> None:
    """A patch as a raw dict whose parts are not what :func:`compact` makes (positions as a
    list, rows as a plain dict of tensors): say what to pass (the declaration would only name
    the types)."""
    if not isinstance(patch, dict):
        return  # the declaration says what came
    at, rows = patch.get("at"), patch.get("rows")
    if at is not None and not isinstance(at, torch.Tensor):
        raise ProtocolError(
            f"{_WHAT} 'at' must be a 1-d int64 tensor of flat positions n * T + t, as "
            f"compact() returns it; got a {type(at).__name__}: pass "
            "torch.as_tensor(at, dtype=torch.int64), or compact()'s patch as it is")
    if isinstance(rows, Mapping) and not isinstance(rows, TensorDictBase):
        keys = [str(k)[:40] for k in itertools.islice(rows, 8)]
        raise ProtocolError(
            f"{_WHAT} 'rows' must be a TensorDict of one row per position in 'at', as "
            f"compact() returns it; got a {type(rows).__name__} of keys {keys}"
            f"{'...' if len(rows) > 8 else ''}: pass TensorDict(rows, batch_size=[len(at)]), "
            "or compact()'s patch as it is")


def _checked(frames: TensorDictBase, patch: CompactPatch) -> tuple[torch.Tensor, TensorDictBase]:
    """The patch against the frames this side received (their batch size already bounded by
    the share this side asked for: ``Batch.from_body``)."""
    at, rows = patch.at, patch.rows
    if frames.batch_dims != 2:
        raise ProtocolError(f"{_WHAT}: frames of batch size {list(frames.batch_size)}, "
                            "expected [envs, steps]")
    n, t = frames.batch_size
    _check_positions(at, n, t, _WHAT)
    for key in rows.keys(include_nested=True, leaves_only=True):
        _check_key(frames, rows, _path(key), _WHAT)
    return at, rows


def _check_positions(at: torch.Tensor, n: int, t: int, what: str) -> None:
    if at.numel() and (int(at[0]) < 0 or int(at[-1]) >= n * t
                       or not bool((at[1:] > at[:-1]).all())):
        raise ProtocolError(f"{what} 'at' must be increasing positions in [0, {n * t}) "
                            f"({n} envs x {t} steps), got {at.numel()} from {int(at.min())} "
                            f"to {int(at.max())}")
    # Each env's last step has no follower here, so 'at' must hold all n of them. Counted,
    # not listed: the batch size is the peer's claim, and nothing is allocated from it
    # (increasing positions in range: exactly n of them end an env's row iff all do).
    if t and int((at % t == t - 1).sum()) != n:
        last = [k * t + t - 1 for k in range(min(n, 8))]
        raise ProtocolError(f"{what} 'at' must hold every env's last step {last}"
                            f"{'...' if n > 8 else ''}: its next observation cannot be "
                            "rebuilt from the batch")


def _entry(frames: TensorDictBase, path: Key) -> tuple[Any, Key | None]:
    """``frames[path]`` (None: absent) and the first proper prefix of ``path`` that holds
    a tensor, not a map (None: there is none). Never raises: the path is a peer's."""
    node: Any = frames
    for depth, part in enumerate(path):
        if not isinstance(node, TensorDictBase):
            return None, path[:depth]
        node = node.get(part, None)
        if node is None:
            return None, None
    return node, None


def _check_key(frames: TensorDictBase, rows: TensorDictBase, path: Key, what: str) -> None:
    row = rows.get(path)
    if path[0] in ("next", "collector") or path in _NOT_OBSERVATIONS:
        raise ProtocolError(f"{what} rows {path}: not an observation key")
    now, blocked = _entry(frames, path)
    twin, twin_blocked = _entry(frames, ("next", *path))
    if blocked is not None or twin_blocked is not None:
        raise ProtocolError(f"{what} rows {path}: the frames' {blocked or twin_blocked} is a "
                            "tensor, not a map: a row key cannot nest under it")
    if not isinstance(now, torch.Tensor):
        raise ProtocolError(f"{what} rows {path}: the frames have no {path} to rebuild "
                            f"('next', *{path}) from")
    if twin is not None:
        raise ProtocolError(f"{what} rows {path}: the frames hold ('next', *{path}) already")
    if not isinstance(row, torch.Tensor) or row.dtype != now.dtype \
            or row.shape[1:] != now.shape[2:]:
        got = f"{row.dtype} {list(row.shape[1:])}" if isinstance(row, torch.Tensor) \
            else type(row).__name__
        raise ProtocolError(f"{what} rows {path}: {got} per row, expected {now.dtype} "
                            f"{list(now.shape[2:])} (as {path})")
