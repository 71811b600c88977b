"""AsyncBatchedCollector's local env worker processes: what each is given, how they start.

The collector's face (:mod:`.collector`) decides when they start and stop; this is what
they are: one process per group of envs (``envs_per_worker``), each given its slot's
shared-memory blocks, doorbells and chunk ring (:class:`~asyncrl._inference.local_channels.
LocalChannels`), the layouts it writes, where the trainer's gymnasium ids are registered,
and the spawn token its hello proves itself with; spawned torch-free when the envs are
named (:meth:`LocalEnvWorkers.torch_free`).

>>> plan = LocalEnvWorkers(groups=[["CartPole-v1"]], create_env_kwargs={}, chunk_steps=8,
...                        heartbeat=(1.0, 10.0), spin=0.0, splits=1, start_method="spawn",
...                        token="t")
>>> plan.torch_free()   # named envs, plain kwargs: no torch in the env workers
True
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transports import CurveClient

from ..._inference.env_stepper import EnvWorkerConfig
from ..._inference.env_worker import env_worker_main
from ..._inference.info_columns import InfoColumn
from ..._inference.local_channels import LocalChannels
from ..._inference.outputs import OutputLayout
from ..._protocol.env_source import MAIN_MODULES, is_plain
from ..._rollout.env_ids import EnvIdSource
from ..._spawn.processes import WorkerProcesses

__all__ = ["LocalEnvWorkers"]

Path = tuple[str, ...]


@dataclass(frozen=True)
class LocalEnvWorkers:
    """The local env workers of one collector: slot ``k`` steps the envs of ``groups[k]``."""

    groups: Sequence[Sequence[Any]]
    create_env_kwargs: Mapping[str, Any]
    chunk_steps: int
    heartbeat: tuple[float, float]  # (interval, peer_timeout)
    spin: float
    splits: int
    start_method: str
    token: str  # proves to the collector's admission that a hello comes from its child

    def processes(self, endpoint: str, backend: str, obs_paths: list[Path],
                  outputs: OutputLayout, channels: LocalChannels,
                  identities: Mapping[int, bytes], curve: CurveClient | None,
                  infos: Sequence[InfoColumn] = (), *,
                  next_observations: bool = True) -> WorkerProcesses:
        """The processes (not started): each joins the hub at ``endpoint`` as
        ``identities[slot]`` (with ``curve``, its key for a CURVE hub); ``infos``: the
        info columns (``info_keys``) their chunks hold; ``next_observations=False``
        (``compact_obs=True``): their chunks hold no ``("next", obs)`` twins."""
        interval, timeout = self.heartbeat
        extra_paths = [p for p, _, _ in outputs.extras]
        parent = os.getpid()
        ids = {f for group in self.groups for f in group if isinstance(f, str)}
        sources = tuple(s for s in map(EnvIdSource.of, sorted(ids)) if s is not None)

        def args(slot: int, identity: bytes) -> tuple[Any, ...]:
            blocks = channels.blocks[slot]
            config = EnvWorkerConfig(
                slot=slot, factories=self.groups[slot], create_env_kwargs=self.create_env_kwargs,
                obs_block=blocks.obs.name, act_block=blocks.act.name, obs_paths=obs_paths,
                extra_paths=extra_paths, chunk_steps=self.chunk_steps,
                heartbeat_interval=interval, peer_timeout=timeout,
                request_bell=channels.request_bell, answer_bell=channels.answer_bells[slot],
                spin=self.spin, chunk_ring=channels.rings[slot].names,
                chunk_bell=channels.chunk_bell, room_bell=channels.room_bells[slot],
                splits=self.splits, curve=curve, env_sources=sources, token=self.token,
                info_columns=list(infos), next_observations=next_observations)
            return (endpoint, identity, config, backend, parent)

        return WorkerProcesses(len(self.groups), env_worker_main, args,
                               identity=lambda slot: identities[slot],
                               start_method=self.start_method, name="asyncrl-env-worker",
                               torch_free=self.torch_free(),
                               preload=self.env_modules(sources))

    def env_modules(self, sources: Sequence[EnvIdSource] = ()) -> list[str]:
        """The modules the envs come from (an import path's, a registered id's entry
        point's), for the torch-free fork server to import once for all env workers.

        >>> LocalEnvWorkers([["benchmarks.atari_env:make_atari"]], {}, 8, (1.0, 10.0), 0.0,
        ...                 1, "spawn", "t").env_modules()
        ['benchmarks.atari_env']
        """
        paths = {f.partition(":")[0] for group in self.groups for f in group
                 if isinstance(f, str) and ":" in f}
        # (not the trainer's script: a torch-free child never runs it)
        return sorted((paths | {s.module for s in sources}) - set(MAIN_MODULES))

    def torch_free(self) -> bool:
        """Whether the env workers can run without torch (spawned, ~100 MB less each).

        Yes when the envs are named (gym ids, import paths resolved in the worker) and
        their kwargs are plain data. A callable goes to workers forked as before: it may
        come from the user's script, which a torch-free child does not run, and its
        module most often imports torch anyway (a spawned child would import it again,
        seconds per worker). ``ASYNCRL_TORCH_FREE_ENV_WORKERS=0`` forks them in any case
        (a faster start: no fresh interpreter per worker).
        """
        if os.environ.get("ASYNCRL_TORCH_FREE_ENV_WORKERS", "1") == "0":
            return False
        return (all(isinstance(f, str) for group in self.groups for f in group)
                and is_plain(dict(self.create_env_kwargs)))
