"""MultiCollector's constructor arguments, checked once: one frozen object for the run.

:meth:`MultiConfig.check` runs every check of the arguments in the order the
constructor always did (the first wrong argument is the one reported) and builds
one :class:`MultiConfig`, which the collector keeps (``collector.config``) and
passes whole: to its run (:mod:`.run`), which hands the coordinator its part
(:class:`~asyncrl._coordinator.config.CoordinatorConfig`, the rollout's options
inside, as every welcome carries them) whole in turn. :meth:`MultiConfig.worker_specs`
builds what each local worker gets, once the weight-sync schemes are known.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar, overload

import torch

from ..._coordinator.config import CoordinatorConfig
from ..._coordinator.loss_policy import LossPolicy
from ..._rollout.devices import DeviceLayout
from ..._rollout.env_ids import EnvIdSource
from ..._rollout.options import RolloutOptions
from ..._worker.spec import WorkerSpec
from ...weights import WeightSyncScheme, ZmqWeightSyncScheme
from ...weights._torchrl import as_weight_sync_schemes
from .._config import (
    ThreadOptions,
    WorkerLayout,
    check_cat_results,
    check_int,
    check_preemptive_threshold,
    check_rollout,
    check_timeout,
    check_total_frames,
    compact_obs_option,
    split_frames,
)
from .._env_factories import check_picklable, travelling, worker_envs

__all__ = ["MultiConfig", "config_view", "default_schemes"]

T = TypeVar("T")


@dataclass(frozen=True)
class MultiConfig:
    """A MultiCollector's checked arguments: who collects, how much, how, and where.

    >>> from asyncrl import MultiSyncCollector
    >>> config = MultiSyncCollector("CartPole-v1", num_workers=2, frames_per_batch=100).config
    >>> config.coordinator.share_frames, config.frames_per_batch, config.rollout.set_truncated
    ((50, 50), 100, False)
    """

    layout: WorkerLayout
    threads: ThreadOptions
    #: policy / env / storing devices; batches are moved to ``storing_device`` here.
    devices: DeviceLayout
    #: The coordinator's part, passed to it whole: sync, each worker's share, prefetch,
    #: how shares are joined, ``on_worker_loss``... and the rollout's options.
    coordinator: CoordinatorConfig
    #: ``init_random_frames`` of the whole run (each worker's part is the coordinator's).
    init_random_frames: int
    #: Where remote workers connect (None: a private ipc socket, local workers only).
    listen: str | None
    #: A directory made by ``asyncrl keys generate`` (None: ``ASYNCRL_CURVE_*`` when listening).
    curve_keys: str | None
    #: Largest message a listening hub takes (None: derived from what is asked, see
    #: multi/run.py); ZeroMQ holds a whole message before anyone sees its sender.
    max_message_bytes: int | None
    backend: str | None
    heartbeat_interval: float
    peer_timeout: float
    #: Seconds a worker may owe work and deliver nothing before it is lost (None: never).
    sample_timeout: float | None
    #: ``"wait"`` / ``"restart"``: seconds the trainer waits for a lost worker's
    #: replacement before the run fails (None: no bound).
    replacement_timeout: float | None
    #: Seconds the trainer's first call waits for every worker to join (None: no bound).
    startup_timeout: float | None

    @property
    def rollout(self) -> RolloutOptions:
        """The options every worker's rollout runs with (devices: the worker's)."""
        return self.coordinator.rollout

    @property
    def frames_per_batch(self) -> int:
        """Frames per yielded batch: every share of a sync round, or one worker's batch."""
        shares = self.coordinator.share_frames
        return sum(shares) if self.coordinator.sync else shares[0]

    @classmethod
    def check(cls, collector: str, sync: bool, arguments: Mapping[str, Any]) -> MultiConfig:
        """Every argument of the constructor as it got them (``constructor_arguments(locals())``:
        no defaults here, its own apply); ``collector``: its class name, for messages."""
        a = arguments
        layout = WorkerLayout.check(a["create_env_fn"], num_workers=a["num_workers"],
                                    remote_workers=a["remote_workers"],
                                    envs_per_worker=a["envs_per_worker"],
                                    listen=a["listen"])
        prefetch = check_int("prefetch", a["prefetch"], minimum=1)
        loss_policy = LossPolicy.check(a["on_worker_loss"])
        total_frames = check_total_frames(a["total_frames"])
        threads = ThreadOptions.check(a["num_threads"], a["num_sub_threads"],
                                      a["start_method"])
        cat_results = check_cat_results(a["cat_results"])
        preemptive_threshold = check_preemptive_threshold(a["preemptive_threshold"])
        share_frames = split_frames(a["frames_per_batch"], layout.total, layout.envs_per_worker,
                                    sync=sync)
        devices, rollout = check_rollout(a, worker_devices=True)
        compact_obs = compact_obs_option(collector, a["compact_obs"])
        shared_memory_batches = a["shared_memory_batches"]
        if not isinstance(shared_memory_batches, bool):
            raise TypeError(f"shared_memory_batches must be True or False, got "
                            f"{shared_memory_batches!r}")
        init_random_frames = int(a["init_random_frames"] or 0)
        coordinator = CoordinatorConfig(
            sync=sync, share_frames=tuple(share_frames), prefetch=prefetch,
            preemptive_threshold=preemptive_threshold, cat_results=cat_results,
            init_random_frames=init_random_frames // max(1, layout.total),
            loss_policy=loss_policy, accept_remote=layout.remote_workers > 0,
            max_remote_workers=layout.remote_workers, first_remote_index=layout.num_workers,
            batch_budget=_batch_budget(sync, total_frames, share_frames),
            compact_obs=compact_obs, shared_memory_batches=shared_memory_batches,
            rollout=rollout)
        return cls(layout=layout, threads=threads, devices=devices, coordinator=coordinator,
                   init_random_frames=init_random_frames, listen=a["listen"],
                   curve_keys=a["curve_keys"], max_message_bytes=a["max_message_bytes"],
                   backend=a["backend"], heartbeat_interval=a["heartbeat_interval"],
                   peer_timeout=a["peer_timeout"],
                   sample_timeout=check_timeout("sample_timeout", a["sample_timeout"]),
                   replacement_timeout=check_timeout("replacement_timeout",
                                                     a["replacement_timeout"]),
                   startup_timeout=check_timeout("startup_timeout",
                                                 a["startup_timeout"]))

    def plan_schemes(self, schemes: dict[str, WeightSyncScheme]) -> None:
        """Tell each weight scheme how the run goes, before any worker starts; a scheme
        that cannot serve it raises ValueError saying which can."""
        for model_id, scheme in schemes.items():
            self.coordinator.loss_policy.check_scheme(model_id, scheme)
            scheme.plan(workers=self.layout.total, remote_workers=self.layout.remote_workers)
            if scheme.model_id is None:  # its welcome config may name it (a served module's)
                scheme.model_id = model_id

    def worker_specs(self, *, policy: Any, policy_factory: Any, create_env_kwargs: Any,
                     schemes: dict[str, WeightSyncScheme]) -> tuple[WorkerSpec, list[WorkerSpec]]:
        """The spec every worker shares, and one per local worker (its own env and kwargs).

        What travels to local workers is pickled here, so that a lambda or a local
        closure fails in the constructor with what to do instead.
        """
        layout = self.layout
        envs = worker_envs(layout.create_env_fn, create_env_kwargs, layout.num_workers)
        spec = WorkerSpec(
            create_env_fn=envs[0][0], create_env_kwargs=envs[0][1],
            envs_per_worker=layout.envs_per_worker,
            policy=policy if policy_factory is None else None, policy_factory=policy_factory,
            rollout=self.rollout, weight_sync_schemes=schemes,
            torch_threads=self.threads.num_sub_threads,
        )
        # Ids the trainer registered at run time (a package's import, main()'s register):
        # where they come from, for workers forked from a server that never ran main().
        spec.env_source = EnvIdSource.of(spec.create_env_fn)
        local = [replace(spec, create_env_fn=fn, create_env_kwargs=kwargs,
                         env_source=EnvIdSource.of(fn))
                 for fn, kwargs in envs[:layout.num_workers]]
        if layout.num_workers:
            check_picklable(travelling(spec, layout.create_env_fn, create_env_kwargs,
                                       envs[:layout.num_workers]),
                            start_method=self.threads.start_method)
        return spec, local


class config_view(Generic[T]):
    """A collector's read-only attribute read from its ``config`` (TorchRL's attribute
    names, kept as views: the checked value lives in one place).

    >>> from asyncrl import MultiSyncCollector
    >>> MultiSyncCollector("CartPole-v1", num_workers=2, frames_per_batch=8).num_workers
    2
    """

    def __init__(self, read: Callable[[MultiConfig], T]) -> None:
        self._read = read
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __set__(self, instance: object, value: object) -> None:
        # Set, it would change nothing the run reads: refused rather than ignored.
        name = type(instance).__name__
        raise AttributeError(f"{name}.{self._name} is read from the checked arguments "
                             f"(collector.config) and cannot be changed: pass "
                             f"{self._name}=... to {name}(...)")

    @overload
    def __get__(self, instance: None, owner: type) -> config_view[T]: ...
    @overload
    def __get__(self, instance: object, owner: type) -> T: ...

    def __get__(self, instance: object, owner: type) -> T | config_view[T]:
        if instance is None:
            return self
        return self._read(instance.config)  # type: ignore[attr-defined]


def _batch_budget(sync: bool, total_frames: int | None, share_frames: list[int]) -> int | None:
    """Async: the batches ``total_frames`` allows (rounded up to whole batches, as the
    collector rounds it); None: sync (rounds are sized by the trainer), or endless."""
    if sync or total_frames is None or total_frames <= 0:
        return None
    return math.ceil(total_frames / share_frames[0])


def default_schemes(weight_sync_schemes: Mapping[str, Any] | None,
                    policy: Any) -> dict[str, WeightSyncScheme]:
    """asyncrl's schemes (TorchRL's translated); a module policy syncs over ZeroMQ by default."""
    schemes = as_weight_sync_schemes(weight_sync_schemes)
    if "policy" not in schemes and isinstance(policy, torch.nn.Module):
        schemes["policy"] = ZmqWeightSyncScheme()
    return schemes


