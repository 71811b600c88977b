"""Start asyncrl workers as Ray actors (optional extra: ``pip install asyncrl[ray]``).

Ray only places the processes: each actor runs :func:`asyncrl.worker.run_worker`
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

        from .._spec import WorkerSpec
        from ..worker import run_worker

        spec = WorkerSpec(**spec_kwargs)
        return anyio.run(lambda: run_worker(endpoint, spec, **options))


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
    **actor_options: Any,
) -> RayWorkers:
    """Start ``num_workers`` Ray actors that join the collector at ``endpoint``.

    ``env`` is a gymnasium id or ``"pkg.mod:factory"``; ``policy`` an import path
    of a function returning the policy (None: random actions). ``curve_keys`` is
    a directory that exists on the Ray nodes (``asyncrl keys generate``).
    """
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    spec_kwargs = {"create_env_fn": env, "policy_factory": policy,
                   "envs_per_worker": envs_per_worker}
    options = {"curve_keys": curve_keys, "reconnect": reconnect, "peer_timeout": peer_timeout}
    actors = [WorkerActor.options(  # type: ignore[attr-defined]  # added by @ray.remote
                  num_cpus=num_cpus, **actor_options).remote()
              for _ in range(num_workers)]
    runs = [actor.run.remote(endpoint, spec_kwargs, options) for actor in actors]
    return RayWorkers(actors, runs)
