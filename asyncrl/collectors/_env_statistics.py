"""Workers' env state, kept on the trainer: what a replacement gets; merged observation stats.

Each worker's ``NormalizeObservation`` learns its own ``obs_rms`` from the
observations it sees. ``sync_env_statistics()`` merges them, as RLlib's
synchronised filters do: every worker's running mean, variance and count are
combined with the parallel-variance formula (Chan et al., the one gymnasium's
``RunningMeanStd.update_from_moments`` applies), and the merged statistics go
back to every worker whose statistics were merged. From the second merge on,
only what each worker saw since the last merge is added (its statistics less
the merged ones it was given, or what was merged of them), so no observation
is counted twice; the merged mean and variance are those of every observation
seen by any worker (plus the ``RunningMeanStd`` prior of each env at the first
merge: a count of 1e-4 with mean 0 and variance 1 in gymnasium).

:class:`EnvStatistics` also keeps the last env state read from (or loaded into)
each worker index, which a replacement of that worker is given before its first
batch.

Workers' statistics are hostile input (a remote host, or a NaN from a local env):
each is checked before anything is merged (:func:`refusal`): numbers, finite, the
variance not negative, one shape for every worker, and a count that the frames
collected explain (:class:`Ceiling`). A worker whose statistics fail is left out
of the merge and is not written back to; the others merge.

>>> import numpy as np
>>> a = Moments(np.array([1.0]), np.array([0.0]), 2.0)    # seen: 1, 1
>>> b = Moments(np.array([4.0]), np.array([1.0]), 2.0)    # seen: 3, 5
>>> merged = a + b
>>> merged.mean.tolist(), merged.var.tolist(), merged.count
([2.5], [2.75], 4.0)
>>> (merged - a).mean.tolist(), (merged - a).var.tolist()
([4.0], [1.0])
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from .._errors import CollectorError
from .._rollout.env_state import OBS_STATS

__all__ = ["Ceiling", "EnvStatistics", "Merge", "Moments", "obs_entries", "refusal"]

_Entry = tuple[str, str, Mapping[str, Any]]  # env key, wrapper key, stats
_Place = tuple[str, str]  # env key, wrapper key
#: Each frame a worker was asked for may end an episode (a reset observation each: 2x),
#: ``reset_at_each_iter`` or ``reset()`` adds one observation per env per share (at most
#: 1x: a share has a frame per env at least), and 1x more is a margin.
OBSERVATIONS_PER_FRAME = 4


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

    def finite(self) -> bool:
        return bool(np.isfinite(self.mean).all() and np.isfinite(self.var).all()
                    and np.isfinite(self.count))

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




@dataclass(frozen=True)
class Ceiling:
    """How far a worker's count may grow past what the trainer knew it held.

    A ``NormalizeObservation`` counts one per observation, and a worker observes
    only while it collects what it was asked for: at most
    :data:`OBSERVATIONS_PER_FRAME` observations per frame it delivered or owes, plus
    one share for its envs' first resets (before any frame). A count beyond that is
    not honest: merged, it would outweigh every other worker (the merge is weighted
    by count)."""

    delivered: int
    owed: int
    share: int

    @property
    def growth(self) -> float:
        return float(OBSERVATIONS_PER_FRAME * (self.delivered + self.owed + self.share))

    def text(self, known: float) -> str:
        return (f"the {known:g} it was known to hold plus {OBSERVATIONS_PER_FRAME} x "
                f"({self.delivered} frames delivered + {self.owed} owed + one share of "
                f"{self.share}) = {known + self.growth:g} observations")


def refusal(stats: Any, *, shape: tuple[int, ...] | None = None, known: float = 0.0,
            ceiling: Ceiling | None = None) -> str | None:
    """Why ``stats`` (``{"mean", "var", "count"}`` as a peer sent them) cannot be merged;
    None: they can. ``shape``: the mean's and variance's (the other workers')."""
    if not isinstance(stats, Mapping) or set(stats) != {"mean", "var", "count"}:
        got = sorted(map(str, stats)) if isinstance(stats, Mapping) else type(stats).__name__
        return f"expected running statistics (mean, var, count), got {got!r:.200}"
    for name in ("mean", "var"):
        why = _array_refusal(name, stats[name], shape)
        if why is not None:
            return why
        shape = np.shape(stats[name])  # the variance's is the mean's
    if (np.asarray(stats["var"]) < 0).any():
        return "var has negative entries: a variance is >= 0"
    count = stats["count"]
    number = isinstance(count, int | float | np.integer | np.floating)
    if isinstance(count, int) and not isinstance(count, bool):
        number = abs(count) < 2 ** 63  # (a bigger one is no count: nor a float's isfinite)
    if isinstance(count, bool) or not number or not math.isfinite(count) or count < 0:
        return f"count {count!r:.80} is not a finite number >= 0"
    if ceiling is not None and count > known + ceiling.growth:
        return f"count {count:g} is more than {ceiling.text(known)}: no collection explains it"
    return None


def _array_refusal(name: str, value: Any, shape: tuple[int, ...] | None) -> str | None:
    try:
        array = np.asarray(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        return f"{name} is not an array of numbers: {exc}"
    if array.dtype.kind not in "fiu":
        return f"{name} must be numbers (float or int), got {array.dtype} of shape {array.shape}"
    if shape is not None and array.shape != shape:
        return (f"{name} has shape {array.shape}, the other workers' {shape}: every worker "
                "must normalise the same observation")
    bad = int(array.size - np.isfinite(array).sum())
    if bad:
        return f"{name} is not finite ({bad} NaN or infinite entries of {array.size})"
    return None


class Merge(NamedTuple):
    """What :meth:`EnvStatistics.merge` found: the merge, and per worker what to write back
    (the merged) or why its statistics were refused (not merged, not written back)."""

    merged: Moments
    updates: dict[Hashable, dict[str, Any]]
    refused: dict[Hashable, tuple[int, str]]  # token: (index, why)


@dataclass
class _Held:
    """What the trainer knows of one worker's ``obs_rms`` entries (per env and wrapper)."""

    #: What of each entry the base already holds: the merge written back to it, or
    #: what was merged of it where the write failed (absent: none of it).
    counted: dict[_Place, Moments] = field(default_factory=dict)
    #: The count each entry is known to hold: counted, or loaded by the user.
    known: dict[_Place, float] = field(default_factory=dict)

    def copy(self) -> _Held:
        return _Held(dict(self.counted), dict(self.known))


class EnvStatistics:
    """The env state the trainer keeps per worker index, and the base of the last merge."""

    def __init__(self) -> None:
        #: The last env state read from or loaded into each worker index.
        self.carried: dict[int, dict[str, Any]] = {}
        self._base: Moments | None = None
        self._held: dict[Hashable, _Held] = {}  # per worker token
        self._carried_held: dict[int, _Held] = {}  # per worker index: its carried state's

    def remember(self, index: int, token: Hashable, state: Any, *, loaded: bool = False) -> None:
        """``state`` was read from (``loaded``: written into) worker ``index`` (``token``)."""
        if not isinstance(state, dict):
            return
        self.carried[index] = state
        held = self._held.setdefault(token, _Held())
        if loaded:  # the user's statistics: none of them is in the base; their counts known
            for env_key, wrapper_key, stats in obs_entries(state):
                held.counted.pop((env_key, wrapper_key), None)
                if refusal(stats) is None:
                    held.known[env_key, wrapper_key] = float(stats["count"])
        self._carried_held[index] = held.copy()

    def carry(self, index: int, token: Hashable) -> dict[str, Any] | None:
        """The state a replacement of worker ``index`` (``token``) is given, if any."""
        state = self.carried.get(index)
        if state is not None:
            held = self._carried_held.get(index, _Held()).copy()
            for env_key, wrapper_key, stats in obs_entries(state):  # the trainer sends them
                if refusal(stats) is None:
                    held.known[env_key, wrapper_key] = float(stats["count"])
            self._held[token] = held
        return state

    def merge(self, states: Mapping[Hashable, tuple[int, Any]],
              ceilings: Mapping[Hashable, Ceiling] | None = None) -> Merge:
        """Merge ``{token: (index, env state)}``'s ``obs_rms``, each worker's checked first
        (``ceilings``: how far each one's counts may have grown, see :class:`Ceiling`).

        Raises :class:`CollectorError` when no worker has ``obs_rms`` or every one's
        statistics are refused."""
        entries = {token: list(obs_entries(state)) for token, (_, state) in states.items()}
        if not any(entries.values()):
            raise CollectorError(
                f"sync_env_statistics(): no worker's env has running observation statistics "
                f"({OBS_STATS!r}): wrap the env in gymnasium.wrappers.NormalizeObservation "
                "(or gymnasium.wrappers.vector.NormalizeObservation) in create_env_fn")
        shape = self._base.mean.shape if self._base is not None else _common_shape(entries)
        merged, refused = self._base, {}
        for token, (index, _) in states.items():
            parts, why = self._parts(token, entries[token], shape, (ceilings or {}).get(token))
            total = merged
            with np.errstate(over="ignore", invalid="ignore"):  # judged just below
                for part in parts:
                    total = part if total is None else total + part
            if why is None and total is not None and not total.finite():
                places = ", ".join(f"{env_key} {wrapper_key}.{OBS_STATS}"
                                   for env_key, wrapper_key, _ in entries[token])
                why = (f"{places}: these statistics overflow the merge (the merged mean or "
                       "variance would not be finite)")
            if why is not None:
                refused[token] = (index, why)
            else:
                merged = total
        if merged is None or all(token in refused for token, found in entries.items() if found):
            raise CollectorError(
                "sync_env_statistics(): every worker's statistics were refused, nothing is "
                "merged or written: " + "; ".join(f"worker {i}: {why}"
                                                  for i, why in refused.values()))
        return Merge(merged, {token: _write_back(found, merged) for token, found in entries.items()
                              if token not in refused}, refused)

    def merged(self, merged: Moments, states: Mapping[Hashable, tuple[int, Any]],
               written: set[Hashable] | None = None) -> None:
        """``merged`` (the merge of ``states``) was written back to ``written`` (all of
        them by default); the others keep what they held, all of it now in the base."""
        self._base = merged
        for token, (index, state) in states.items():
            held = self._held.setdefault(token, _Held())
            for env_key, wrapper_key, stats in list(obs_entries(state)):
                place = (env_key, wrapper_key)
                if written is None or token in written:
                    state[env_key][wrapper_key][OBS_STATS] = merged.to_stats()
                    held.counted[place] = merged
                else:
                    held.counted[place] = Moments.of(stats, f"worker {index}'s {OBS_STATS}")
                held.known[place] = held.counted[place].count
            self.carried[index] = state
            self._carried_held[index] = held.copy()

    def _parts(self, token: Hashable, entries: list[_Entry], shape: tuple[int, ...] | None,
               ceiling: Ceiling | None) -> tuple[list[Moments], str | None]:
        """What each of a worker's entries adds to the base, or why they are refused."""
        held = self._held.get(token, _Held())
        parts = []
        for env_key, wrapper_key, stats in entries:
            place = (env_key, wrapper_key)
            why = refusal(stats, shape=shape, known=held.known.get(place, 0.0), ceiling=ceiling)
            if why is not None:
                return [], f"{env_key} {wrapper_key}.{OBS_STATS}: {why}"
            part = Moments.of(stats, f"{env_key} {wrapper_key}.{OBS_STATS}")
            counted = held.counted.get(place)
            parts.append(part if counted is None else part - counted)
        return parts, None


def _common_shape(entries: Mapping[Hashable, list[_Entry]]) -> tuple[int, ...] | None:
    """The mean's shape most workers send (the first one's on a tie): the odd one out is
    refused, rather than whoever answered first deciding."""
    shapes: Counter[tuple[int, ...]] = Counter()
    for found in entries.values():
        for _, _, stats in found:
            try:
                shapes[np.shape(np.asarray(stats.get("mean")))] += 1
            except (TypeError, ValueError, RuntimeError):
                continue
    return shapes.most_common(1)[0][0] if shapes else None


def obs_entries(state: Any) -> Iterator[_Entry]:
    """``(env key, wrapper key, obs_rms)`` for each ``obs_rms`` in an env state."""
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
