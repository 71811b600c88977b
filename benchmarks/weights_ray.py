"""Weights through Ray's object store against ZeroMQ (direct, relay) and the gloo chain (#39).

A local Ray cluster of two raylets (``ray.cluster_utils.Cluster``): the trainer
is the driver on the head raylet, two workers run on the second raylet (its
``env_host`` resource), started by :func:`asyncrl.launch.ray.launch_workers`
(one actor per worker) or :func:`~asyncrl.launch.ray.launch_hosts` (one actor
running both workers behind a relay). For each scheme and model size a
``MultiSyncCollector(remote_workers=2, listen=...)`` collects one batch, then
times ``await collector.update_policy_weights()`` (send to both acks: applied)
``--reps`` times; the p50 and p90 are printed as a table and as JSON lines.

    python -m benchmarks.weights_ray                   # 4k, 4M, 67M parameters
    python -m benchmarks.weights_ray --sizes 4k --reps 5 --schemes ray zmq   # smoke run
"""

from __future__ import annotations

import argparse
import json
import shlex
import socket
import statistics
import sys
import time
from typing import Any

import anyio
import torch
from torch import nn

SIZES = {"4k": 4_096, "4M": 4_194_304, "67M": 67_108_864}
SCHEMES = ("ray", "zmq", "zmq-relay", "chain")


class BigPolicy(nn.Module):
    """A CartPole policy that carries ``size`` float32 parameters; the action is 0."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.weights = nn.Parameter(torch.zeros(size))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.zeros(observation.shape[:-1], dtype=torch.int64)


def policy_4k() -> BigPolicy:
    return BigPolicy(SIZES["4k"])


def policy_4M() -> BigPolicy:
    return BigPolicy(SIZES["4M"])


def policy_67M() -> BigPolicy:
    return BigPolicy(SIZES["67M"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scheme(name: str) -> Any:
    from asyncrl.weights import (
        DistributedWeightSyncScheme,
        RayWeightSyncScheme,
        ZmqWeightSyncScheme,
    )

    if name == "ray":
        return RayWeightSyncScheme(timeout=300)
    if name == "chain":
        return DistributedWeightSyncScheme(algorithm="chain", timeout=300,
                                           init_method=f"tcp://127.0.0.1:{_free_port()}")
    return ZmqWeightSyncScheme()


def _launch(name: str, endpoint: str, size: str) -> Any:
    from asyncrl.launch.ray import launch_hosts, launch_workers

    common = {"env": "CartPole-v1", "policy": f"benchmarks.weights_ray:policy_{size}",
              "peer_timeout": 120.0, "max_restarts": 0}
    if name == "zmq-relay":
        return launch_hosts(endpoint, workers_per_host=2, resources={"env_host": 1}, **common)
    return launch_workers(endpoint, num_workers=2, resources={"env_host": 1}, **common)


async def measure(name: str, size: str, reps: int) -> dict[str, Any]:
    from asyncrl import MultiSyncCollector

    policy = BigPolicy(SIZES[size])
    async with MultiSyncCollector(
            "CartPole-v1", policy, num_workers=0, remote_workers=2,
            listen="tcp://127.0.0.1:0", frames_per_batch=20, total_frames=-1,
            weight_sync_schemes={"policy": _scheme(name)}, peer_timeout=120) as collector:
        async with _launch(name, collector.endpoint, size):
            async for _ in collector:  # both workers joined (and caught up)
                break
            await collector.update_policy_weights()  # warm-up: buffers, store actor
            times = []
            for rep in range(reps):
                policy.weights.data.fill_(rep)
                start = time.perf_counter()
                await collector.update_policy_weights()
                times.append(time.perf_counter() - start)
    times.sort()
    return {"scheme": name, "size": size, "params": SIZES[size], "reps": reps,
            "p50_ms": round(1000 * statistics.median(times), 2),
            "p90_ms": round(1000 * times[min(len(times) - 1, int(0.9 * len(times)))], 2)}


def _cluster() -> Any:
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2, resources={"env_host": 2})
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    cluster.wait_for_nodes()
    return cluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=SCHEMES)
    parser.add_argument("--reps", type=int, default=0,
                        help="updates timed per case (default: 20 / 10 / 5 by size)")
    args = parser.parse_args()
    print("command: python -m benchmarks.weights_ray " + shlex.join(sys.argv[1:]))
    import ray

    cluster = _cluster()
    rows = []
    try:
        for size in args.sizes:
            reps = args.reps or {"4k": 20, "4M": 10, "67M": 5}[size]
            for name in args.schemes:
                row = anyio.run(measure, name, size, reps)
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(f"\n| params | {' | '.join(args.schemes)} |  (p50 ms, send -> both acks)")
    print("|---|" + "---|" * len(args.schemes))
    for size in args.sizes:
        cells = [next((f"{r['p50_ms']}" for r in rows
                       if r["size"] == size and r["scheme"] == s), "-") for s in args.schemes]
        print(f"| {size} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
