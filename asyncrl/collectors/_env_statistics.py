"""Workers' env state, kept on the trainer: what a replacement gets; merged observation stats.

Each worker's ``NormalizeObservation`` learns its own ``obs_rms`` from the
observations it sees. ``sync_env_statistics()`` merges them, as RLlib's
synchronised filters do: every worker's running mean, variance and count are
combined with the parallel-variance formula (Chan et al., the one gymnasium's
``RunningMeanStd.update_from_moments`` applies), and the merged statistics go
back to every worker. From the second merge on, only what each worker saw since
the last merge is added (its statistics less the merged ones it was given), so
no observation is counted twice; the merged mean and variance are those of every
observation seen by any worker (plus the ``RunningMeanStd`` prior of each env at
the first merge: a count of 1e-4 with mean 0 and variance 1 in gymnasium).

:class:`EnvStatistics` also keeps the last env state read from (or loaded into)
each worker index, which a replacement of that worker is given before its first
batch.

>>> import numpy as np
>>> a = Moments(np.array([1.0]), np.array([0.0]), 2.0)    # seen: 1, 1
>>> b = Moments(np.array([4.0]), np.array([1.0]), 2.0)    # seen: 3, 5
>>> merged = a + b
>>> merged.mean.tolist(), merged.var.tolist(), merged.count
([2.5], [3.25], 4.0)
>>> (merged - a).mean.tolist(), (merged - a).var.tolist()
([4.0], [1.0])
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import CollectorError
from .._rollout.env_state import OBS_STATS

__all__ = ["EnvStatistics", "Moments"]

_Entry = tuple[str, str, Mapping[str, Any]]  # env key, wrapper key, stats


@dataclass(frozen=True)
class Moments:
    """Mean, (population) variance and count of a set of observations, in float64."""

    mean: np.ndarray
    var: np.ndarray
    count: float

    @classmethod
    def of(cls, stats: Mapping[str, Any], what: str) -> Moments:
        try:
            return cls(np.asarray(stats["mean"], dtype=np.float64),
                       np.asarray(stats["var"], dtype=np.float64), float(stats["count"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CollectorError(f"{what} is not running statistics (mean, var, count): "
                                 f"{exc}") from None

    def to_stats(self) -> dict[str, Any]:
        return {"mean": self.mean.copy(), "var": self.var.copy(), "count": self.count}

    def __add__(self, other: Moments) -> Moments:
        count = self.count + other.count
        if count <= 0:
            return self
        delta = other.mean - self.mean
        m2 = (self.var * self.count + other.var * other.count
              + delta ** 2 * self.count * other.count / count)
        return Moments(self.mean + delta * other.count / count, m2 / count, count)

    def __sub__(self, part: Moments) -> Moments:
        """What, added to ``part``, gives ``self`` (nothing if ``self`` holds no more)."""
        count = self.count - part.count
        if count <= 1e-12 * max(1.0, self.count):
            return Moments(np.zeros_like(self.mean), np.zeros_like(self.var), 0.0)
        mean = (self.mean * self.count - part.mean * part.count) / count
        delta = mean - part.mean
        m2 = (self.var * self.count - part.var * part.count
              - delta ** 2 * part.count * count / self.count)
        return Moments(mean, np.maximum(m2 / count, 0.0), count)


class EnvStatistics:
    """The env state the trainer keeps per worker index, and the base of the last merge."""

    def __init__(self) -> None:
        #: The last env state read from or loaded into each worker index.
        self.carried: dict[int, dict[str, Any]] = {}
        self._base: Moments | None = None
        self._from_base: set[Hashable] = set()  # workers whose obs_rms grew from _base
        self._carried_from_base: set[int] = set()

    def remember(self, index: int, token: Hashable, state: Any, *, loaded: bool = False) -> None:
        """``state`` was read from (``loaded``: written into) worker ``index`` (``token``)."""
        if not isinstance(state, dict):
            return
        self.carried[index] = state
        if loaded:  # the user's statistics: they did not grow from the merged ones
            self._from_base.discard(token)
        if token in self._from_base:
            self._carried_from_base.add(index)
        else:
            self._carried_from_base.discard(index)

    def carry(self, index: int, token: Hashable) -> dict[str, Any] | None:
        """The state a replacement of worker ``index`` (``token``) is given, if any."""
        if index in self._carried_from_base:
            self._from_base.add(token)
        return self.carried.get(index)

    def merge(self, states: Mapping[Hashable, tuple[int, Any]]
              ) -> tuple[Moments, dict[Hashable, dict[str, Any]]]:
        """Merge ``{token: (index, env state)}``'s ``obs_rms``; returns the merged moments
        and, per token, the part of an env state that writes them back."""
        merged = self._base
        entries: dict[Hashable, list[_Entry]] = {}
        for token, (index, state) in states.items():
            entries[token] = list(_obs_entries(state))
            for env_key, wrapper_key, stats in entries[token]:
                part = Moments.of(stats, f"worker {index}'s {env_key} {wrapper_key}.{OBS_STATS}")
                if self._base is not None and token in self._from_base:
                    part = part - self._base
                merged = part if merged is None else _added(merged, part, index)
        if merged is None or not any(entries.values()):
            raise CollectorError(
                f"sync_env_statistics(): no worker's env has running observation statistics "
                f"({OBS_STATS!r}): wrap the env in gymnasium.wrappers.NormalizeObservation "
                "(or gymnasium.wrappers.vector.NormalizeObservation) in create_env_fn")
        return merged, {token: _write_back(found, merged) for token, found in entries.items()}

    def merged(self, merged: Moments, states: Mapping[Hashable, tuple[int, Any]]) -> None:
        """The merge of ``states`` was written back to each of them: the new base."""
        self._base = merged
        self._from_base = set(states)
        self._carried_from_base = {index for index, _ in states.values()}
        for index, state in states.values():
            for env_key, wrapper_key, _ in _obs_entries(state):
                state[env_key][wrapper_key][OBS_STATS] = merged.to_stats()
            self.carried[index] = state


def _added(merged: Moments, part: Moments, index: int) -> Moments:
    if merged.mean.shape != part.mean.shape:
        raise CollectorError(f"sync_env_statistics(): worker {index}'s {OBS_STATS} has shape "
                             f"{part.mean.shape}, another's {merged.mean.shape}: every worker "
                             "must normalise the same observation")
    return merged + part


def _obs_entries(state: Any) -> Iterator[_Entry]:
    if not isinstance(state, Mapping):
        return
    for env_key, wrappers in state.items():
        if isinstance(wrappers, Mapping):
            for wrapper_key, fields in wrappers.items():
                if isinstance(fields, Mapping) and isinstance(fields.get(OBS_STATS), Mapping):
                    yield str(env_key), str(wrapper_key), fields[OBS_STATS]


def _write_back(entries: list[_Entry], merged: Moments) -> dict[str, Any]:
    """The part of an env state that sets each entry's ``obs_rms`` to ``merged``."""
    out: dict[str, Any] = {}
    for env_key, wrapper_key, _ in entries:
        out.setdefault(env_key, {})[wrapper_key] = {OBS_STATS: merged.to_stats()}
    return out
