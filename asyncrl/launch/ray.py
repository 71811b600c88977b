"""Start asyncrl workers as Ray actors (optional extra: ``pip install asyncrl[ray]``).

Ray only places the processes: each actor runs :func:`asyncrl._worker.worker.run_worker`
and connects back to the collector's ``listen`` address over ZeroMQ, exactly as
``asyncrl worker --connect`` does. Env and policy are import paths (or a
gymnasium id) resolved inside the actor.

>>> import ray                                                      # doctest: +SKIP
>>> ray.init()
>>> async with MultiSyncCollector("CartPole-v1", policy, num_workers=0, remote_workers=8,
...                               listen="tcp://0.0.0.0:5555", frames_per_batch=8000) as c:
...     workers = launch_workers(f"tcp://{head_ip}:5555", num_workers=8, env="CartPole-v1",
...                              policy="mypkg.policies:make_policy")
...     async for batch in c:
...         ...
>>> workers.wait(timeout=30)   # exit codes, once the collector closed them

:func:`launch_hosts` starts one actor per Ray node instead, which runs K worker
processes and their relay, as ``asyncrl worker --workers K`` does: each weight
version then crosses the network once per node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

try:
    import ray
except ImportError as exc:  # pragma: no cover - depends on the optional extra
    raise ImportError("asyncrl.launch.ray needs Ray: pip install 'asyncrl[ray]'") from exc


@ray.remote
class WorkerActor:
    """One asyncrl worker inside a Ray actor process."""

    def run(self, endpoint: str, spec_kwargs: dict[str, Any], options: dict[str, Any]) -> int:
        import anyio

        from .._worker.worker import run_worker

        spec = _host_spec(spec_kwargs)  # the device is checked here, on the worker's node
        return anyio.run(lambda: run_worker(endpoint, spec, **options))


@ray.remote
class HostActor:
    """One node's asyncrl workers and relay (``asyncrl worker --workers K``) in a Ray actor."""

    def run(self, endpoint: str, spec_kwargs: dict[str, Any], options: dict[str, Any]) -> int:
        from .._worker.host import HostWorkers

        return HostWorkers(endpoint, _host_spec(spec_kwargs), **options).run()


@dataclass
class RayWorkers:
    """Handles of launched workers: ``wait()`` for their exit codes, ``kill()`` to stop them."""

    actors: list[Any]
    runs: list[Any] = field(default_factory=list)

    def wait(self, timeout: float | None = None) -> list[int]:
        """Exit codes (0: closed by the collector), once every worker finished."""
        return list(ray.get(self.runs, timeout=timeout))

    def kill(self) -> None:
        for actor in self.actors:
            ray.kill(actor)


def launch_workers(
    endpoint: str,
    *,
    num_workers: int,
    env: str,
    policy: str | None = None,
    envs_per_worker: int = 1,
    curve_keys: str | None = None,
    reconnect: bool = False,
    peer_timeout: float = 10.0,
    num_cpus: float = 1,
    device: str | None = None,
    **actor_options: Any,
) -> RayWorkers:
    """Start ``num_workers`` Ray actors that join the collector at ``endpoint``.

    ``env`` is a gymnasium id or ``"pkg.mod:factory"``; ``policy`` an import path
    of a function returning the policy (None: random actions). ``curve_keys`` is
    a directory that exists on the Ray nodes (``asyncrl keys generate``).
    ``device`` is where each worker's policy runs (``asyncrl worker --device``),
    checked in the actor on its node: for ``"cuda"`` give the actors a GPU
    (``num_gpus=1``), else the run fails with the checker's message.
    """
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    spec_kwargs = _spec_kwargs(env, policy, envs_per_worker, device)
    options = {"curve_keys": curve_keys, "reconnect": reconnect, "peer_timeout": peer_timeout}
    actors = [WorkerActor.options(  # type: ignore[attr-defined]  # added by @ray.remote
                  num_cpus=num_cpus, **actor_options).remote()
              for _ in range(num_workers)]
    runs = [actor.run.remote(endpoint, spec_kwargs, options) for actor in actors]
    return RayWorkers(actors, runs)


def launch_hosts(
    endpoint: str,
    *,
    workers_per_host: int,
    env: str,
    policy: str | None = None,
    envs_per_worker: int = 1,
    nodes: list[str] | None = None,
    curve_keys: str | None = None,
    reconnect: bool = False,
    peer_timeout: float = 10.0,
    device: str | None = None,
    **actor_options: Any,
) -> RayWorkers:
    """Start ``workers_per_host`` workers and one relay on each Ray node (or each of ``nodes``).

    Each node gets one actor pinned to it (``NodeAffinitySchedulingStrategy``)
    that reserves ``workers_per_host`` CPUs and spawns the workers, as
    ``asyncrl worker --workers K`` does on a host: weights reach the node once
    per version. ``nodes`` are Ray node ids (default: every alive node). The
    collector's ``remote_workers`` is ``workers_per_host x`` the number of nodes.
    ``device``: as for :func:`launch_workers` (one GPU per worker: ``num_gpus=K``).
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if workers_per_host < 1:
        raise ValueError(f"workers_per_host must be >= 1, got {workers_per_host}")
    if nodes is None:
        nodes = [node["NodeID"] for node in ray.nodes()  # type: ignore[no-untyped-call]
                 if node.get("Alive")]
    if not nodes:
        raise ValueError("no alive Ray node to start workers on: is ray.init() done?")
    spec_kwargs = _spec_kwargs(env, policy, envs_per_worker, device)
    options = {"workers": workers_per_host, "curve_keys": curve_keys, "reconnect": reconnect,
               "peer_timeout": peer_timeout}
    actors = [HostActor.options(  # type: ignore[attr-defined]  # added by @ray.remote
                  num_cpus=workers_per_host,
                  scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                  **actor_options).remote()
              for node in nodes]
    runs = [actor.run.remote(endpoint, spec_kwargs, options) for actor in actors]
    return RayWorkers(actors, runs)


def _spec_kwargs(env: str, policy: str | None, envs_per_worker: int,
                 device: str | None = None) -> dict[str, Any]:
    # Import paths and plain values only: the actor builds its WorkerSpec itself.
    return {"create_env_fn": env, "policy_factory": policy, "envs_per_worker": envs_per_worker,
            "device": device}


def _host_spec(spec_kwargs: dict[str, Any]) -> Any:
    """The actor's WorkerSpec, its device checked on the node it runs on."""
    from .._worker.spec import WorkerSpec, host_rollout_options

    kwargs = dict(spec_kwargs)
    rollout = host_rollout_options(kwargs.pop("device", None))
    return WorkerSpec(**kwargs, rollout=rollout)
