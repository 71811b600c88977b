"""Start asyncrl workers as Ray actors (optional extra: ``pip install asyncrl[ray]``).

Ray only places the processes: each actor runs :func:`asyncrl._worker.worker.run_worker`
and connects back to the collector's ``listen`` address over ZeroMQ, exactly as
``asyncrl worker --connect`` does. Env and policy are import paths (or a
gymnasium id) resolved inside the actor.

>>> import ray                                                      # doctest: +SKIP
>>> ray.init()
>>> with launch_workers(f"tcp://{head_ip}:5555", num_workers=8, env="CartPole-v1",
...                     policy="mypkg.policies:make_policy") as workers:
...     async with MultiSyncCollector("CartPole-v1", policy, num_workers=0, remote_workers=8,
...                                   listen="tcp://0.0.0.0:5555", frames_per_batch=8000) as c:
...         async for batch in c:
...             ...
...     outcomes = workers.wait(timeout=30)  # one ActorOutcome per actor, once closed
>>> # every actor ended and its process gone: nothing holds the cluster's CPUs

Ray restarts an actor whose process dies (``max_restarts``); its worker joins
the run again as a new remote worker, with the latest weights before its first
frame. See docs/multihost.md for how membership changes affect a run.

:func:`launch_hosts` starts one actor per Ray node instead, which runs K worker
processes and their relay, as ``asyncrl worker --workers K`` does: each weight
version then crosses the network once per node.
"""

from __future__ import annotations

from typing import Any

try:
    import ray
except ImportError as exc:  # pragma: no cover - depends on the optional extra
    raise ImportError("asyncrl.launch.ray needs Ray: pip install 'asyncrl[ray]'") from exc

from ._ray_handle import ActorOutcome, RayWorkers


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
        import os

        from .._worker.host import HostWorkers

        # The worker processes it spawns are not Ray workers: RayWeightSyncScheme's
        # receiver joins the cluster from this address to fetch weights by reference.
        os.environ.setdefault("RAY_ADDRESS", ray.get_runtime_context().gcs_address)
        return HostWorkers(endpoint, _host_spec(spec_kwargs), **options).run()


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
    join_timeout: float | None = None,
    num_cpus: float = 1,
    device: str | None = None,
    max_restarts: int = -1,
    info_keys: list[Any] | None = None,
    **actor_options: Any,
) -> RayWorkers:
    """Start ``num_workers`` Ray actors that join the collector at ``endpoint``.

    ``env`` is a gymnasium id or ``"pkg.mod:factory"``; ``policy`` an import path
    of a function returning the policy (None: random actions). ``curve_keys`` is
    a directory that exists on the Ray nodes (``asyncrl keys generate``).
    ``device`` is where each worker's policy runs (``asyncrl worker --device``),
    checked in the actor on its node: for ``"cuda"`` give the actors a GPU
    (``num_gpus=1``), else the run fails with the checker's message.
    The collector's rollout options (``max_frames_per_traj``, ``info_keys``, ...) reach
    every actor in its welcome; ``info_keys`` given here (``asyncrl worker --info-key``)
    must equal the collector's own, or the workers are refused naming both.

    ``max_restarts``: how many times Ray restarts an actor whose process died
    (-1: always, 0: never, as RLlib restarts failed env runners); the restarted
    worker joins as a new remote worker and gets the latest weights before its
    first frame. ``join_timeout``: how long a worker refused because the run is
    full keeps asking (``asyncrl worker --join-timeout``). Close the returned
    :class:`RayWorkers` (``with``, ``close()``) to end every actor.
    """
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    spec_kwargs = _spec_kwargs(env, policy, envs_per_worker, device, info_keys)
    options = {"curve_keys": curve_keys, "reconnect": reconnect, "peer_timeout": peer_timeout,
               **_join_option(join_timeout)}
    actor_options = {**_restart_options(max_restarts), "num_cpus": num_cpus, **actor_options}

    def start(count: int | None) -> tuple[list[Any], list[Any]]:
        actors = [WorkerActor.options(**actor_options).remote()  # type: ignore[attr-defined]
                  for _ in range(count or 0)]
        return actors, [actor.run.remote(endpoint, spec_kwargs, options) for actor in actors]

    actors, runs = start(num_workers)
    return RayWorkers(actors, runs, _more=start)


def launch_hosts(
    endpoint: str,
    *,
    workers_per_host: int,
    env: str,
    policy: str | None = None,
    envs_per_worker: int = 1,
    nodes: list[str] | None = None,
    resources: dict[str, float] | None = None,
    exclude_trainer_node: bool = False,
    curve_keys: str | None = None,
    reconnect: bool = False,
    peer_timeout: float = 10.0,
    join_timeout: float | None = None,
    device: str | None = None,
    max_restarts: int = -1,
    info_keys: list[Any] | None = None,
    **actor_options: Any,
) -> RayWorkers:
    """Start ``workers_per_host`` workers and one relay on each selected Ray node.

    Each node gets one actor pinned to it (``NodeAffinitySchedulingStrategy``)
    that reserves ``workers_per_host`` CPUs and spawns the workers, as
    ``asyncrl worker --workers K`` does on a host: weights reach the node once
    per version. The collector's ``remote_workers`` is ``workers_per_host x`` the
    number of nodes.

    Which nodes: ``nodes`` (Ray node ids; default every alive node), less those
    that lack ``resources`` (e.g. ``{"env_host": 1}``, a custom resource given to
    ``ray start --resources``; each host also reserves them), less the trainer's
    own node with ``exclude_trainer_node=True`` (the node of this driver, which
    holds the GPU). ``RayWorkers.scale()`` later starts a host on each node that
    joined the cluster since and matches the same selection.
    ``device``: as for :func:`launch_workers` (one GPU per worker: ``num_gpus=K``);
    ``info_keys`` too.
    ``max_restarts``, ``join_timeout``: as for :func:`launch_workers`; a restarted
    host starts its K workers again.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if workers_per_host < 1:
        raise ValueError(f"workers_per_host must be >= 1, got {workers_per_host}")
    spec_kwargs = _spec_kwargs(env, policy, envs_per_worker, device, info_keys)
    options = {"workers": workers_per_host, "curve_keys": curve_keys, "reconnect": reconnect,
               "peer_timeout": peer_timeout, **_join_option(join_timeout)}
    actor_options = {**_restart_options(max_restarts), "num_cpus": workers_per_host,
                     **({"resources": dict(resources)} if resources else {}), **actor_options}
    started: set[str] = set()

    def start(count: int | None) -> tuple[list[Any], list[Any]]:
        del count  # one host per node
        chosen = [node for node in select_nodes(nodes, resources, exclude_trainer_node)
                  if node not in started]
        started.update(chosen)
        actors = [HostActor.options(  # type: ignore[attr-defined]  # added by @ray.remote
                      scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                      **actor_options).remote()
                  for node in chosen]
        return actors, [actor.run.remote(endpoint, spec_kwargs, options) for actor in actors]

    actors, runs = start(None)
    if not actors:
        raise ValueError("no Ray node to start workers on: is ray.init() done, and does a "
                         f"node match nodes={nodes}, resources={resources}, "
                         f"exclude_trainer_node={exclude_trainer_node}?")
    return RayWorkers(actors, runs, _more=start)


def select_nodes(nodes: list[str] | None = None, resources: dict[str, float] | None = None,
                 exclude_trainer_node: bool = False) -> list[str]:
    """The alive Ray node ids among ``nodes`` (default all) that have ``resources``,
    less this driver's node with ``exclude_trainer_node``."""
    alive = {node["NodeID"]: node.get("Resources", {})
             for node in ray.nodes() if node.get("Alive")}  # type: ignore[no-untyped-call]
    chosen = [node for node in (nodes if nodes is not None else list(alive)) if node in alive]
    if resources:
        chosen = [node for node in chosen
                  if all(alive[node].get(key, 0) >= amount for key, amount in resources.items())]
    if exclude_trainer_node:
        trainer = ray.get_runtime_context().get_node_id()
        chosen = [node for node in chosen if node != trainer]
    return chosen


def _join_option(join_timeout: float | None) -> dict[str, Any]:
    return {} if join_timeout is None else {"join_timeout": join_timeout}


def _restart_options(max_restarts: int) -> dict[str, Any]:
    # The run() under way when the process died is retried on the restarted actor:
    # that is what starts its worker again.
    if max_restarts < -1:
        raise ValueError(f"max_restarts must be -1 (always), 0 (never) or more, "
                         f"got {max_restarts}")
    return {"max_restarts": max_restarts, "max_task_retries": -1 if max_restarts else 0}


def _spec_kwargs(env: str, policy: str | None, envs_per_worker: int,
                 device: str | None = None, info_keys: Any = None) -> dict[str, Any]:
    # Import paths and plain values only: the actor builds its WorkerSpec itself.
    return {"create_env_fn": env, "policy_factory": policy, "envs_per_worker": envs_per_worker,
            "device": device, "info_keys": info_keys}


def _host_spec(spec_kwargs: dict[str, Any]) -> Any:
    """The actor's WorkerSpec, its device checked on the node it runs on."""
    from .._worker.spec import WorkerSpec, host_rollout_options

    kwargs = dict(spec_kwargs)
    rollout = host_rollout_options(kwargs.pop("device", None), kwargs.pop("info_keys", None))
    return WorkerSpec(**kwargs, rollout=rollout)


__all__ = ["ActorOutcome", "HostActor", "RayWorkers", "WorkerActor", "launch_hosts",
           "launch_workers", "select_nodes"]
