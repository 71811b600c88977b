"""What a worker needs to build its envs, its policy and its rollout.

A :class:`WorkerSpec` travels to spawned local workers through multiprocessing
(pickle between our own processes). A remote host builds the same object from
import paths given on its command line: code never travels over the network.
Its rollout options are the trainer's, which its welcome carries as data (see
:meth:`~asyncrl._rollout.options.RolloutOptions.from_wire`), over its own devices.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._rollout.devices import check_device, place_policy
from .._rollout.env_ids import EnvIdSource
from .._rollout.envs import make_env_pool, resolve_import_path
from .._rollout.options import RolloutOptions


@dataclass
class WorkerSpec:
    """How to build one worker: env factory, policy, rollout options, weight schemes.

    A collector makes one per local worker (TorchRL's per-worker ``create_env_fn``
    and ``create_env_kwargs`` lists); they share everything else, the policy too.
    """

    create_env_fn: Any
    create_env_kwargs: Mapping[str, Any] | None = None
    envs_per_worker: int = 1
    policy: Any = None
    policy_factory: Callable[[], Any] | str | None = None
    #: TorchRL's rollout options and the worker's devices, checked when the collector
    #: built them (a remote host: from its command line, checked there). The welcome's
    #: options replace all but the devices when the worker is admitted.
    rollout: RolloutOptions = field(default_factory=RolloutOptions)
    weight_sync_schemes: dict[str, Any] = field(default_factory=dict)
    torch_threads: int = 1
    #: Where the trainer's gymnasium id ``create_env_fn`` is registered (None: not an
    #: id, or nothing known): imported (and registered) in the worker before make.
    env_source: EnvIdSource | None = None

    def make_env_pool(self) -> Any:
        """The worker's envs; the trainer's id registered here first (see EnvIdSource)."""
        if self.env_source is not None:
            self.env_source.ensure()
        return make_env_pool(self.create_env_fn, create_env_kwargs=self.create_env_kwargs,
                             num_envs=self.envs_per_worker)

    def make_policy(self) -> Any:
        """The worker's own policy (factory, else the unpickled policy, else None).

        A module is moved once to ``rollout.policy_device`` (it is this worker's own
        object: moved in place); weights received later are copied into it there.
        """
        policy = self.policy
        if self.policy_factory is not None:
            factory = self.policy_factory
            if isinstance(factory, str):
                factory = resolve_import_path(factory)
            policy = factory()
        return place_policy(policy, self.rollout.policy_device, copy_module=False)


def host_rollout_options(device: Any = None, info_keys: Any = None) -> RolloutOptions:
    """A remote host's rollout options: its policy on ``device``, checked on this host.

    What ``asyncrl worker --device --info-key`` and the Ray launchers build where the
    workers run. The trainer's devices do not travel: ``storing_device`` is the
    trainer's business, and this host's envs step on its CPU. Every other option comes
    from the trainer in the welcome; ``info_keys`` given here must then equal the
    trainer's (the hello says them, and a host that differs is refused naming both):
    they are a check, and what a trainer before travelling options gets.
    """
    return RolloutOptions(policy_device=check_device("--device", device), info_keys=info_keys)
