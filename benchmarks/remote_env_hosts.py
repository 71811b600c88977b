"""AsyncBatchedCollector: env workers over tcp (inline observations) against shared memory.

    python -m benchmarks.remote_env_hosts --envs 2 --seconds 4 --repeats 2

Same collector, same policy (``benchmarks.collect.make_policy``, mlp64 by default),
Pendulum-v1, one env per env-worker process, N processes in all:

- ``local``: N local env workers (observations and actions in shared memory);
- ``remote``: 1 local env worker plus N - 1 ``asyncrl env-worker`` processes on this host,
  joined over ``tcp://127.0.0.1`` (observations and actions inline in the messages).

Frames/s over ``--seconds`` after a warm-up batch and after every remote host joined;
the median over ``--repeats``, the two layouts interleaved.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import anyio

from asyncrl import AsyncBatchedCollector
from benchmarks.collect import make_policy

ENV = "Pendulum-v1"


def start_host(endpoint: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "asyncrl.cli", "env-worker", "--connect",
                             endpoint, "--env", ENV], env=dict(os.environ))


async def run_once(layout: str, envs: int, policy_name: str, seconds: float,
                   frames_per_batch: int) -> float:
    remote = envs - 1 if layout == "remote" else 0
    options = {"listen": "tcp://127.0.0.1:0", "remote_workers": remote} if remote else {}
    hosts: list[subprocess.Popen[bytes]] = []
    async with AsyncBatchedCollector(ENV, num_envs=envs - remote, frames_per_batch=frames_per_batch,
                                     policy=make_policy(policy_name, ENV), **options) as c:
        try:
            for _ in range(remote):
                hosts.append(start_host(c.endpoint))
            while True:  # every remote host has sent frames
                batch = await c.__anext__()
                seen = set(batch["collector", "worker_id"].tolist())
                if all(envs - remote + i in seen for i in range(remote)):
                    break
            frames, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                frames += (await c.__anext__()).numel()
            return frames / (time.perf_counter() - start)
        finally:
            await c.aclose()
            for host in hosts:
                host.wait(timeout=30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", type=int, default=2)
    p.add_argument("--policy", default="mlp64")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--frames-per-batch", type=int, default=250)
    args = p.parse_args()
    results: dict[str, list[float]] = {"local": [], "remote": []}
    for _ in range(args.repeats):
        for layout in results:
            results[layout].append(anyio.run(run_once, layout, args.envs, args.policy,
                                             args.seconds, args.frames_per_batch))
    print(f"| layout | env processes | {args.policy} fps (median of {args.repeats}) |")
    print("|---|---|---|")
    for layout, fps in results.items():
        print(f"| {layout} | {args.envs} | {statistics.median(fps):,.0f} |")


if __name__ == "__main__":
    main()
