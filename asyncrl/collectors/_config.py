"""The collectors' TorchRL-style constructor arguments, checked once, one concern each.

Every check takes the arguments as the user spelled them and returns them
normalised, or raises a TypeError / ValueError that names the argument, what
came and what is expected: a wrong argument fails in the constructor, in the
trainer, not deep inside the first batch or in every worker. The collectors'
``__init__`` only call these, build their config objects and store them.

A constructor hands its arguments over whole (:func:`constructor_arguments`), and
each config object takes its own fields from them by name: the rollout's options
(:func:`check_rollout`: every field of :class:`~asyncrl._rollout.options.RolloutOptions`
a collector's signature has, and the devices), so an option the rollout reads is
written in the signatures, in ``RolloutOptions`` and where it is used, and no layer
in between lists it.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from transports import parse_endpoint

from .._rollout.devices import DeviceLayout
from .._rollout.options import HOST_FIELDS, RolloutOptions
from .._rollout.plain_policies import check_plain_policy
from .._spawn.forkserver import check_start_method

#: The device arguments (TorchRL's names) :meth:`DeviceLayout.resolve` takes.
DEVICE_ARGUMENTS = ("device", "policy_device", "env_device", "storing_device")
#: The rollout options a collector takes by their own names (the devices come resolved).
ROLLOUT_ARGUMENTS = tuple(f.name for f in fields(RolloutOptions) if f.name not in HOST_FIELDS)


def constructor_arguments(frame: Mapping[str, Any]) -> dict[str, Any]:
    """A collector constructor's arguments by name, from its ``locals()`` taken first thing.

    What its config objects are checked from: each takes its own fields by name.

    >>> def init(self, frames_per_batch, **torchrl_options):
    ...     return constructor_arguments(locals())
    >>> init(None, 8, use_buffers=True)
    {'frames_per_batch': 8}
    """
    return {name: value for name, value in frame.items()
            if name not in ("self", "__class__", "torchrl_options")}


def check_rollout(arguments: Mapping[str, Any], *,
                  worker_devices: bool) -> tuple[DeviceLayout, RolloutOptions]:
    """The devices (TorchRL 0.14's rules) and the rollout's options a collector was given.

    Every field of :class:`RolloutOptions` the constructor takes is read by its name
    (those it lacks keep their defaults); the devices are resolved by
    :class:`DeviceLayout`, and the rollout gets a worker's part of them
    (``worker_devices``: batches leave a worker as host bytes) or all three. A plain
    ``policy`` is checked against the keys and method it is to be called with.

    >>> devices, rollout = check_rollout({"max_frames_per_traj": 5, "device": "cpu"},
    ...                                  worker_devices=True)
    >>> rollout.max_frames_per_traj, rollout.policy_device, rollout.storing_device
    (5, device(type='cpu'), None)
    """
    devices = DeviceLayout.resolve(**{name: arguments.get(name) for name in DEVICE_ARGUMENTS})
    placed = devices.for_worker() if worker_devices else devices
    options: dict[str, Any] = {name: arguments[name] for name in ROLLOUT_ARGUMENTS
                               if name in arguments}
    rollout = RolloutOptions(**options | placed.as_options())
    check_plain_policy(arguments.get("policy"), in_keys=rollout.policy_in_keys,
                       out_keys=rollout.policy_out_keys, method=rollout.policy_method)
    return devices, rollout


def check_int(name: str, value: Any, *, minimum: int) -> int:
    """``value`` as an int >= ``minimum``, or a TypeError / ValueError naming ``name``.

    Integers only: ``2.0`` or ``True`` are refused (TorchRL's arguments are ints
    too), so a wrong type fails here, not deep inside the first batch.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int >= {minimum}, got {type(value).__name__} "
                        f"{value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
    return int(value)


def check_timeout(name: str, value: Any) -> float | None:
    """``value`` as a number of seconds > 0, or None (no bound); else an error naming ``name``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds > 0 or None, got "
                        f"{type(value).__name__} {value!r}")
    seconds = float(value)
    if not seconds > 0:  # also refuses nan
        raise ValueError(f"{name} must be a number of seconds > 0 or None, got {value}")
    return seconds


# -- frames -----------------------------------------------------------------------------------
def check_total_frames(value: Any) -> int | None:
    if value is None:
        return None
    return check_int("total_frames", value, minimum=-(1 << 62))


def normalise_total_frames(total_frames: int | None, frames_per_batch: int) -> int:
    """TorchRL's rule: -1 (or None) is endless; otherwise round up to whole batches."""
    total_frames = check_total_frames(total_frames)
    if total_frames is None or total_frames < 0:
        return -1
    if total_frames == 0:
        raise ValueError("total_frames must be positive, or -1 for an endless collector")
    if total_frames % frames_per_batch:
        rounded = math.ceil(total_frames / frames_per_batch) * frames_per_batch
        warnings.warn(
            f"total_frames ({total_frames}) is not a multiple of frames_per_batch "
            f"({frames_per_batch}); the collector will deliver {rounded} frames",
            UserWarning, stacklevel=3)
        return rounded
    return total_frames


def check_in_process_frames(frames_per_batch: Any, envs_per_worker: Any) -> tuple[int, int]:
    """The in-process collector's ``(frames_per_batch, envs_per_worker)``: whole steps."""
    frames_per_batch = check_int("frames_per_batch", frames_per_batch, minimum=1)
    envs_per_worker = check_int("envs_per_worker", envs_per_worker, minimum=1)
    if frames_per_batch % envs_per_worker:
        raise ValueError(f"frames_per_batch ({frames_per_batch}) must be a multiple of "
                         f"envs_per_worker ({envs_per_worker})")
    return frames_per_batch, envs_per_worker


def split_frames(frames_per_batch: int | Sequence[int], workers: int, envs_per_worker: int,
                 *, sync: bool) -> list[int]:
    """Each worker's frames per batch: one share each of a sync batch, or an async batch each.

    A sequence gives each worker its own share. Every share must be a whole
    number of steps of the worker's ``envs_per_worker`` envs.
    """
    per_env = envs_per_worker
    if isinstance(frames_per_batch, Sequence) and not isinstance(frames_per_batch, str):
        shares = [check_int(f"frames_per_batch[{i}]", f, minimum=1)
                  for i, f in enumerate(frames_per_batch)]
        if len(shares) != workers:
            raise ValueError(f"frames_per_batch has {len(shares)} entries for {workers} "
                             "workers")
    elif sync:
        frames_per_batch = check_int("frames_per_batch", frames_per_batch, minimum=1)
        if frames_per_batch % (workers * per_env):
            raise ValueError(
                f"sync mode splits frames_per_batch={frames_per_batch} over {workers} "
                f"workers x {per_env} envs: make it a multiple of {workers * per_env}")
        shares = [frames_per_batch // workers] * workers
    else:
        shares = [check_int("frames_per_batch", frames_per_batch, minimum=1)] * workers
    for share in shares:
        if share <= 0 or share % per_env:
            raise ValueError(f"each worker's frames ({share}) must be a positive multiple "
                             f"of envs_per_worker ({per_env})")
    return shares


# -- workers ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerLayout:
    """Who collects: ``num_workers`` local processes and ``remote_workers`` that connect.

    ``create_env_fn`` is one factory for every worker, or a list of one per local
    worker (TorchRL's list form; remote workers build their own envs).
    """

    create_env_fn: Any
    num_workers: int
    remote_workers: int
    envs_per_worker: int

    @property
    def total(self) -> int:
        return self.num_workers + self.remote_workers

    @classmethod
    def check(cls, create_env_fn: Any, *, num_workers: Any, remote_workers: Any,
              envs_per_worker: Any, listen: str | None) -> WorkerLayout:
        """TorchRL's spellings: ``num_workers=None`` is 1, or one factory per worker."""
        if num_workers is not None:
            num_workers = check_int("num_workers", num_workers, minimum=0)
        if isinstance(create_env_fn, list | tuple):
            if num_workers is not None and num_workers != len(create_env_fn):
                raise ValueError(f"num_workers={num_workers} but {len(create_env_fn)} env "
                                 "factories were given")
            if not create_env_fn:
                raise ValueError("create_env_fn is an empty list: give one env factory per "
                                 "worker, or one factory and num_workers=N")
            # One factory each (a list of several: see collectors._env_factories).
            num_workers = len(create_env_fn)
            shared = len({id(f) for f in create_env_fn}) == 1
            create_env_fn = create_env_fn[0] if shared else list(create_env_fn)
        num_workers = 1 if num_workers is None else num_workers
        remote_workers = check_int("remote_workers", remote_workers, minimum=0)
        envs_per_worker = check_int("envs_per_worker", envs_per_worker, minimum=1)
        if num_workers + remote_workers < 1:
            raise ValueError("need at least one worker (num_workers + remote_workers >= 1)")
        if remote_workers and listen is None:
            raise ValueError("remote_workers needs listen='tcp://HOST:PORT'")
        if listen is not None:  # a bad one is a ValueError here, not a ZMQError at bind
            parse_endpoint(listen, argument="listen", bind=True)
        return cls(create_env_fn, num_workers, remote_workers, envs_per_worker)


@dataclass(frozen=True)
class ThreadOptions:
    """Threads (TorchRL's meanings) and how local workers start.

    ``num_threads``: the trainer's torch threads (None: the machine's minus the
    local workers); ``num_sub_threads``: each worker's; ``start_method``:
    ``"forkserver"`` (the default) or ``"spawn"``.
    """

    num_threads: int | None
    num_sub_threads: int
    start_method: str

    @classmethod
    def check(cls, num_threads: Any, num_sub_threads: Any,
              start_method: str | None) -> ThreadOptions:
        if num_threads is not None:
            num_threads = check_int("num_threads", num_threads, minimum=1)
        num_sub_threads = check_int("num_sub_threads", num_sub_threads, minimum=1)
        return cls(num_threads, num_sub_threads, check_start_method(start_method))


# -- batches and losses -----------------------------------------------------------------------
def check_cat_results(value: Any) -> str | int:
    """TorchRL's values: ``"stack"``, None (TorchRL: the same as ``"stack"``) or a dim.

    Each worker's share is ``[envs, time]``: the dims to concatenate along are
    0 / -2 (envs) and 1 / -1 (time).
    """
    if value is None or (isinstance(value, str) and value == "stack"):
        return "stack"  # TorchRL's None means "stack", not a concatenation
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) \
            and -2 <= int(value) <= 1:
        return int(value)
    raise ValueError(f"cat_results must be 'stack', None (stack, as in TorchRL) or a dim to "
                     f"concatenate the workers' [envs, time] shares along (0, 1, -1 or -2); "
                     f"got {value!r}")


def check_preemptive_threshold(value: float | None) -> float | None:
    if value is not None and not 0 < value <= 1:
        raise ValueError(f"preemptive_threshold must be in (0, 1], got {value}")
    return value


def compact_obs_option(collector: str, value: Any) -> bool:
    """TorchRL's ``compact_obs`` checked: True drops ``("next", K)`` of each observation /
    state key ``K`` from every batch (TorchRL's meaning); None is TorchRL's default, False."""
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{collector}(compact_obs={value!r:.60}): expected True or False: "
                         "pass compact_obs=True (batches without ('next', observation), as "
                         "TorchRL's) or False")
    return bool(value)


__all__ = [
    "DEVICE_ARGUMENTS",
    "ROLLOUT_ARGUMENTS",
    "ThreadOptions",
    "WorkerLayout",
    "check_cat_results",
    "check_in_process_frames",
    "check_int",
    "check_preemptive_threshold",
    "check_rollout",
    "check_total_frames",
    "compact_obs_option",
    "constructor_arguments",
    "normalise_total_frames",
    "split_frames",
]
