"""The trainer of a Ray job: a collector here, one asyncrl worker host per Ray node.

    python -m examples.ray_job --workers-per-host 2 --total-frames 20000

What deploy/kuberay/rayjob.yaml runs on a KubeRay cluster (docs/deploy.md). It
connects to the Ray cluster (``ray.init()``: the job's cluster, or a local one),
opens a :class:`asyncrl.MultiSyncCollector` listening on ``--port``, starts
``--workers-per-host`` workers behind a weight relay on every Ray node with at
least that many CPUs (:func:`asyncrl.launch.ray.launch_hosts`: Ray only places
the processes, batches and weights go over ZeroMQ), logs ``ready`` once they all
joined, pushes new weights after each batch, and exits 0 once ``--total-frames``
were collected and every host ended cleanly. ``--keys DIR`` (made by
``asyncrl keys generate``, on every node) encrypts and authenticates the traffic.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

import anyio

log = logging.getLogger("examples.ray_job")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="asyncrl collection with worker hosts on Ray nodes")
    p.add_argument("--env", default="CartPole-v1", help="gym id or pkg.mod:factory")
    p.add_argument("--policy", default="examples.service:make_policy",
                   help="import path of the policy factory (the trainer's and the workers')")
    p.add_argument("--workers-per-host", type=int, default=2, help="worker processes per node")
    p.add_argument("--frames-per-batch", type=int, default=2000)
    p.add_argument("--total-frames", type=int, default=20_000)
    p.add_argument("--port", type=int, default=5555, help="where the collector listens")
    p.add_argument("--advertise", default=None, metavar="HOST",
                   help="the address workers connect to (default: this Ray node's IP)")
    p.add_argument("--keys", default=None, help="CURVE key directory, present on every node")
    p.add_argument("--ready-timeout", type=float, default=600.0,
                   help="seconds to wait for every worker to join")
    p.add_argument("--local-cpus", type=int, default=None,
                   help="start a local Ray with this many CPUs instead of joining a cluster")
    return p.parse_args(argv)


def worker_nodes(ray: Any, cpus: int) -> list[str]:
    """Alive Ray nodes with room for a host actor (a head started with 0 CPUs has none)."""
    return [node["NodeID"] for node in ray.nodes()
            if node.get("Alive") and node.get("Resources", {}).get("CPU", 0) >= cpus]


async def collect(args: argparse.Namespace, ray: Any) -> int:
    from asyncrl import MultiSyncCollector
    from asyncrl._rollout.envs import resolve_import_path
    from asyncrl.launch.ray import launch_hosts

    nodes = worker_nodes(ray, args.workers_per_host)
    if not nodes:
        log.error("no Ray node has %d CPUs for a worker host", args.workers_per_host)
        return 1
    remote = args.workers_per_host * len(nodes)
    policy = resolve_import_path(args.policy)()
    async with MultiSyncCollector(
            args.env, policy, num_workers=0, remote_workers=remote,
            listen=f"tcp://0.0.0.0:{args.port}", frames_per_batch=args.frames_per_batch,
            total_frames=args.total_frames, curve_keys=args.keys,
            on_worker_loss="wait") as collector:
        port = collector.endpoint.rsplit(":", 1)[1]
        endpoint = f"tcp://{args.advertise or ray.util.get_node_ip_address()}:{port}"
        hosts = launch_hosts(endpoint, workers_per_host=args.workers_per_host, env=args.env,
                             policy=args.policy, nodes=nodes, curve_keys=args.keys)
        try:
            await collector.wait_ready(timeout=args.ready_timeout)
            log.info("ready: %d workers on %d Ray nodes joined %s", remote, len(nodes),
                     endpoint)
            async for batch in collector:
                log.info("batch of %d frames, %d collected", batch.numel(),
                         collector.frames_collected)
                await collector.update_policy_weights()
        except BaseException:
            hosts.kill()
            raise
    outcomes = await anyio.to_thread.run_sync(lambda: hosts.wait(timeout=60))
    await anyio.to_thread.run_sync(hosts.close)  # every actor ended, its CPUs given back
    # A host with no exit code (still running, or lost) counts as a failure.
    codes = [1 if o.exit_code is None else o.exit_code for o in outcomes]
    log.info("done: host exit codes %s", codes)
    return max(codes, key=abs) if any(codes) else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)-8s %(name)s: %(message)s")
    import ray

    if args.local_cpus is not None:
        ray.init(num_cpus=args.local_cpus, include_dashboard=False, log_to_driver=False)
    else:
        ray.init()  # the job's cluster (RAY_ADDRESS), as `ray job submit` sets it
    try:
        code: int = anyio.run(collect, args, ray)
        return code
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
