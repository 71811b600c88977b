"""MultiCollector's constructor arguments, checked and normalised, one object for the run.

:meth:`MultiConfig.check` runs every check of the arguments in the order the
constructor always did (the first wrong argument is the one reported), and
:meth:`MultiConfig.worker_specs` builds what each local worker gets, once the
weight-sync schemes are known. The constructor stores the results.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..._coordinator.loss_policy import LossPolicy, OnWorkerLoss
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
    check_total_frames,
    split_frames,
)
from .._env_factories import check_picklable, travelling, worker_envs

__all__ = ["MultiConfig", "default_schemes"]


@dataclass(frozen=True)
class MultiConfig:
    """A MultiCollector's checked arguments: who collects, how much, how, and where.

    >>> config = MultiConfig.check(sync=True, create_env_fn="CartPole-v1", num_workers=2,
    ...                            frames_per_batch=100, ...)   # doctest: +SKIP
    >>> config.share_frames, config.frames_per_batch          # doctest: +SKIP
    ([50, 50], 100)
    """

    sync: bool
    layout: WorkerLayout
    threads: ThreadOptions
    #: Each worker's frames per batch (a share of a sync batch, or an async batch).
    share_frames: list[int]
    prefetch: int
    cat_results: str | int
    preemptive_threshold: float | None
    #: What a lost worker does to the run (``on_worker_loss``), every decision of it.
    loss_policy: LossPolicy
    devices: DeviceLayout
    #: The rollout's options each worker runs with (devices: the worker's).
    rollout: RolloutOptions

    @property
    def on_worker_loss(self) -> OnWorkerLoss:
        """The collector's ``on_worker_loss``, as the user spelled it."""
        return self.loss_policy.on_worker_loss

    @property
    def frames_per_batch(self) -> int:
        """Frames per yielded batch: every share of a sync round, or one worker's batch."""
        return sum(self.share_frames) if self.sync else self.share_frames[0]

    @classmethod
    def check(cls, *, sync: bool, create_env_fn: Any, num_workers: Any, remote_workers: Any,
              envs_per_worker: Any, listen: str | None, frames_per_batch: Any,
              total_frames: Any, prefetch: Any, on_worker_loss: Any, cat_results: Any,
              preemptive_threshold: float | None, threads: tuple[Any, Any, str | None],
              devices: Mapping[str, Any], rollout: Mapping[str, Any]) -> MultiConfig:
        """The constructor's arguments as it got them (no defaults here: its own apply).

        ``threads`` is ``(num_threads, num_sub_threads, start_method)``; ``devices``
        and ``rollout`` the keyword arguments of :meth:`DeviceLayout.resolve` and
        :class:`RolloutOptions` (which gets the worker's devices added).
        """
        layout = WorkerLayout.check(create_env_fn, num_workers=num_workers,
                                    remote_workers=remote_workers,
                                    envs_per_worker=envs_per_worker, listen=listen)
        prefetch = check_int("prefetch", prefetch, minimum=1)
        loss_policy = LossPolicy.check(on_worker_loss)
        check_total_frames(total_frames)
        thread_options = ThreadOptions.check(*threads)
        cat_results = check_cat_results(cat_results)
        preemptive_threshold = check_preemptive_threshold(preemptive_threshold)
        share_frames = split_frames(frames_per_batch, layout.total, layout.envs_per_worker,
                                         sync=sync)
        device_layout = DeviceLayout.resolve(**devices)
        options: dict[str, Any] = {**rollout, **device_layout.for_worker().as_options()}
        rollout_options = RolloutOptions(**options)
        return cls(sync=sync, layout=layout, threads=thread_options,
                   share_frames=share_frames, prefetch=prefetch,
                   cat_results=cat_results, preemptive_threshold=preemptive_threshold,
                   loss_policy=loss_policy, devices=device_layout, rollout=rollout_options)

    def plan_schemes(self, schemes: dict[str, WeightSyncScheme]) -> None:
        """Tell each weight scheme how the run goes, before any worker starts; a scheme
        that cannot serve it raises ValueError saying which can."""
        for model_id, scheme in schemes.items():
            self.loss_policy.check_scheme(model_id, scheme)
            scheme.plan(workers=self.layout.total, remote_workers=self.layout.remote_workers)

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


def default_schemes(weight_sync_schemes: Mapping[str, Any] | None,
                    policy: Any) -> dict[str, WeightSyncScheme]:
    """asyncrl's schemes (TorchRL's translated); a module policy syncs over ZeroMQ by default."""
    schemes = as_weight_sync_schemes(weight_sync_schemes)
    if "policy" not in schemes and isinstance(policy, torch.nn.Module):
        schemes["policy"] = ZmqWeightSyncScheme()
    return schemes


