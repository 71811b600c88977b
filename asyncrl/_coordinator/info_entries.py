"""What the coordinator checks of the env info entries a worker's batch carries under ``"next"``.

``info_keys=`` asks each worker to read some entries of its envs' ``info`` dicts
into the batch (see :mod:`asyncrl._rollout.infos`). A remote host runs its own
code, so what it sends under ``"next"`` is checked like the rest of its batch,
before the batch is counted (a refusal drops the batch and the worker, as any bad
batch: :meth:`~asyncrl._coordinator.losses.Losses.bad_batch`):

- ``"next"`` holds the step's flags (``reward``, ``done``, ``terminated``,
  ``truncated``), the twin of a key the batch holds at its root (observations,
  a recurrent state, ``is_init``) and the info entries asked for: nothing else;
- each asked entry is there, its leaves numbers or bools;
- each leaf has the dtype and per-frame shape of its spec in ``info_keys``
  where one was given, else of the first batch a local worker (a process this
  trainer spawned) sent with it; with no local worker, of the first batch;
- without a given spec, a leaf holds at most :data:`MAX_INFO_NUMEL` numbers per
  frame: a larger entry (an image in ``info``) needs its spec given, so that no
  peer's first batch can make every later one carry megabytes per frame.

>>> import torch
>>> from tensordict import TensorDict
>>> entries = InfoEntries(((("steps",), None),), first_remote_index=1)
>>> share = TensorDict({"observation": torch.zeros(2, 3), ("next", "observation"):
...                     torch.zeros(2, 3), ("next", "steps"): torch.zeros(2, 3)}, [2, 3])
>>> entries.problems(share, worker_index=0)
[]
>>> share["next", "secret"] = torch.zeros(2, 3)
>>> entries.problems(share, worker_index=1)  # doctest: +ELLIPSIS
["('next', 'secret'): sent, but the trainer did not ask for it (info_keys asks ..."]
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase, is_leaf_nontensor

__all__ = ["MAX_INFO_NUMEL", "InfoEntries"]

#: Numbers per frame an info leaf may hold without a spec given in ``info_keys``
#: (16 KiB of float32: a scalar, a position, a small histogram; not an image).
MAX_INFO_NUMEL = 4096
_FLAGS = frozenset({"reward", "done", "terminated", "truncated"})
_NUMBERS = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                      torch.float16, torch.bfloat16, torch.float32, torch.float64})
_Path = tuple[str, ...]
_Leaf = tuple[torch.dtype, tuple[int, ...]]


class InfoEntries:
    """The ``"next"`` entries a batch may hold, and the specs of the asked info leaves.

    ``info_keys``: the collector's, normalised (``((path, (shape, dtype) or None),
    ...)``); ``first_remote_index``: worker indices from it on are remote hosts,
    whose batches never set a learned spec while local workers may.
    """

    def __init__(self, info_keys: Any, *, first_remote_index: int = 0) -> None:
        self._asked: list[_Path] = [tuple(path) for path, _ in info_keys or ()]
        self._given: dict[_Path, _Leaf] = {
            tuple(path): (_torch_dtype(spec[1]), tuple(spec[0]))
            for path, spec in info_keys or () if spec is not None}
        self._learned: dict[_Path, _Leaf] = {}
        self._first_remote = first_remote_index

    def problems(self, td: TensorDictBase, *, worker_index: int) -> list[str]:
        """What is wrong with ``td``'s ``"next"`` entries ([] if nothing); leaves are
        tensors with the batch's leading dims already (checked before)."""
        dims = td.batch_dims
        roots = set()
        problems: list[str] = []
        found: dict[_Path, _Leaf] = {}
        leaves = [key if isinstance(key, tuple) else (key,) for key in td.keys(
            include_nested=True, leaves_only=True, is_leaf=is_leaf_nontensor)]
        for path in leaves:
            if path[0] != "next":
                roots.add(path)
        for path in leaves:
            if path[0] != "next" or path[1:] in roots or path[1:] in {(f,) for f in _FLAGS}:
                continue
            asked = next((a for a in self._asked if path[1:1 + len(a)] == a), None)
            if asked is None:
                problems.append(f"{path}: sent, but the trainer did not ask for it (info_keys "
                                f"asks {self._asked or 'nothing'}; under 'next' a batch holds "
                                "the flags, its root keys' twins and those entries)")
                continue
            value = td.get(path)
            if not isinstance(value, torch.Tensor):  # a string, a msgpack value
                problems.append(f"{path}: {type(value).__name__}; an info entry holds numbers "
                                "or bools")
                continue
            found[path[1:]] = (value.dtype, tuple(value.shape[dims:]))
        missing = [str(("next", *asked)) for asked in self._asked
                   if not any(p[:len(asked)] == asked for p in found)]
        if missing:
            problems.append(
                f"the batch lacks {', '.join(missing)}, which info_keys asked for: a remote "
                "host reads the info entries it is told to, not the trainer's; start it with "
                "asyncrl worker --info-key KEY per entry (launch_workers/launch_hosts: "
                "info_keys=[...])")
        problems += [p for path, leaf in found.items()
                     if (p := self._leaf_problem(path, leaf, worker_index)) is not None]
        if not problems and (worker_index < self._first_remote or not self._first_remote):
            for path, leaf in found.items():
                self._learned.setdefault(path, leaf)
        return problems[:20]

    def _leaf_problem(self, path: _Path, leaf: _Leaf, worker_index: int) -> str | None:
        dtype, shape = leaf
        key = ("next", *path)
        if dtype not in _NUMBERS:
            return f"{key}: {dtype} values; an info entry holds numbers or bools"
        want = self._given.get(path)
        source = "its spec in info_keys"
        if want is None:
            numel = 1
            for size in shape:
                numel *= size
            if numel > MAX_INFO_NUMEL:
                return (f"{key}: {numel} numbers per frame (shape {list(shape)}), more than the "
                        f"{MAX_INFO_NUMEL} an info entry without a spec may hold; give its spec "
                        f"(info_keys={{{path!r}: ((shape), dtype)}}) to allow it")
            want, source = self._learned.get(path), "the first batch with it"
        if want is not None and leaf != want:
            return (f"{key}: {dtype} of per-frame shape {list(shape)}, expected {want[0]} of "
                    f"shape {list(want[1])} ({source}): an info entry keeps its shape and "
                    "dtype for the whole run")
        return None


def _torch_dtype(name: str) -> torch.dtype:
    from .._rollout.policies import torch_dtype

    return torch_dtype(name)
