"""``info_keys`` under central inference: the info leaves as extra columns of each chunk.

The meaning is the other collectors' (:mod:`asyncrl._rollout.infos`): info entry ``k``
of the step that produced frame t is ``batch["next", k][t]``, specs from the first
step or given, nested dicts as nested keys, missing entries zero, a later value of
another shape or dtype a :class:`~asyncrl.SpecMismatchError` naming the key.

What is central inference's own: a chunk's layout is fixed before any env worker
starts (the trainer makes the local workers' rings, and checks every remote chunk
against it), so the trainer decides the columns once, :func:`learn_columns` on the env
it builds for the layouts (one random step, then a reset, as TorchRL's
``set_info_dict_reader`` and the other collectors do; skipped when every spec is
given), and hands them whole to every env worker: a local one in its config, a remote
host in its welcome (:class:`~asyncrl._protocol.EnvWelcome` ``infos``). A worker reads
exactly those leaves with those specs (:func:`attach_columns`) into preallocated numpy
arrays, which its step copies into the chunk. Torch-free, but for
:func:`learn_columns` (the trainer's).

>>> columns = [(("steps",), "int64", ())]
>>> reader = column_reader(columns, num_envs=2)
>>> reader.read_env(0, {"steps": 3}); reader.read_env(1, {})
>>> reader.paths, reader.arrays[0].tolist()
([('steps',)], [3, 0])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._rollout.infos import (
    InfoReader,
    attach_info_reader,
    normalise_info_keys,
    refuse_observation_clash,
    refuse_torchrl_pool,
)

__all__ = ["InfoColumn", "attach_columns", "column_reader", "learn_columns"]

Path = tuple[str, ...]
#: One info leaf of a chunk: its path (under ``"next"``), dtype name and per-env shape.
InfoColumn = tuple[Path, str, tuple[int, ...]]


def learn_columns(pool: Any, info_keys: Any) -> list[InfoColumn]:
    """The leaves ``info_keys`` (normalised) read from ``pool``'s envs, with their specs.

    Given specs are taken as they are; an entry without one is learned from one random
    step of ``pool`` (then reset), its nested dicts flattened into leaves. The
    trainer's, on the env it built for the layouts; raises what the other collectors
    raise (a TorchRL env, an entry the first step lacks and no spec, a clash with an
    observation).
    """
    if not info_keys:
        return []
    if all(spec is not None for _, spec in info_keys) and pool.reads_info:
        reader = column_reader([(p, s[1], s[0]) for p, s in info_keys], pool.num_envs)
        refuse_observation_clash(reader, pool)
    else:
        learned = attach_info_reader(pool, info_keys)  # (in the trainer: it has torch)
        pool.info_reader = None  # the layouts' env: it reads nothing more
        assert learned is not None
        reader = learned
    return [(path, arr.dtype.name, tuple(arr.shape[1:]))
            for path, arr in zip(reader.paths, reader.arrays, strict=True)]


def column_reader(columns: Sequence[InfoColumn], num_envs: int) -> InfoReader:
    """An :class:`InfoReader` of exactly ``columns`` (their specs fixed, no learning)."""
    keys = normalise_info_keys({tuple(p): (tuple(s), d) for p, d, s in columns})
    reader = InfoReader(keys or (), num_envs)
    reader.read_env(0, {})  # (while learning: only takes the given specs)
    reader.learn_done()
    return reader


def attach_columns(pool: Any, columns: Sequence[InfoColumn]) -> InfoReader:
    """Give ``pool`` a reader of ``columns`` (an env worker's: read at every step)."""
    refuse_torchrl_pool(pool)
    reader = column_reader(columns, pool.num_envs)
    pool.info_reader = reader
    return reader
